package purge

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// systemctl is airlock.service through systemctl(1), when systemd runs the host
// (sd_booted(3): /run/systemd/system exists).
type systemctl struct{}

func (systemctl) Active() bool {
	if _, err := os.Stat("/run/systemd/system"); err != nil {
		return false
	}
	return exec.Command("systemctl", "is-active", "--quiet", "airlock.service").Run() == nil
}

func (systemctl) Stop() error {
	if out, err := exec.Command("systemctl", "stop", "airlock.service").CombinedOutput(); err != nil {
		return fmt.Errorf("systemctl stop airlock: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
