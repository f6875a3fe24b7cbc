package rawsys

// System call numbers of linux/amd64.
const (
	sysRead         = 0
	sysWrite        = 1
	sysClose        = 3
	sysClockGettime = 228
	sysExitGroup    = 231
	sysOpenat       = 257
)
