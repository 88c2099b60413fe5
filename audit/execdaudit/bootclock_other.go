//go:build !linux

package execdaudit

import "time"

// BootNow is 0 outside Linux: no /proc, so commands name no process group.
func BootNow() time.Duration { return 0 }
