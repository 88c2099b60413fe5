//go:build !linux

package execdaudit

import "time"

// bootNow is 0 outside Linux: no /proc, so commands name no process group.
func bootNow() time.Duration { return 0 }
