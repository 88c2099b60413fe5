package execdaudit

import (
	"time"

	"golang.org/x/sys/unix"
)

// BootNow is CLOCK_BOOTTIME, the clock of /proc's start times; 0 when unreadable.
func BootNow() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
