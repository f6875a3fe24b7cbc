package rawsys

// System call numbers of linux/arm64 (the generic table).
const (
	sysOpenat       = 56
	sysClose        = 57
	sysRead         = 63
	sysWrite        = 64
	sysExitGroup    = 94
	sysClockGettime = 113
)
