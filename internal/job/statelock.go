package job

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
)

// StateLock is a state lock that a stack interrupted in the middle of its script may still
// hold: tofu releases its lock when it stops gracefully, but not when it is killed first.
type StateLock struct {
	// ID is the lock's ID when the stack's log (tofu's "Lock Info:" block) or the local
	// backend's lock file names it; empty when neither does.
	ID string `json:"id,omitempty"`
	// Command releases the lock: a run of the same environment that force-unlocks it after
	// init. Empty when the ID is unknown (the stack's next plan prints it).
	Command string `json:"command,omitempty"`
}

// localLockFile is where OpenTofu's and Terraform's local backend keeps the lock of the default
// state path (terraform.tfstate in the stack's directory).
const localLockFile = ".terraform.tfstate.lock.info"

// lockScanBytes is how much of the end of a stack's log is searched for a lock ID.
const lockScanBytes = 64 << 10

// lockIDLine matches the ID line of tofu's "Lock Info:" block.
var lockIDLine = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`(?m)^\s*ID:\s*(\S+)\s*$`) })

// validLockID keeps an ID that is safe to print in a command line: lock IDs are UUIDs for the
// local, http and most other backends, and opaque but plain for the rest.
var validLockID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._:@/+=-]{1,128}$`) })

// lockIDInLog returns the lock ID of tofu's last failure to release its own lock in log, or "".
// The "Lock Info:" block of a failure to acquire a lock is not taken: that lock is another
// run's, and releasing it would let two runs write the state at once.
func lockIDInLog(log []byte) string {
	i := bytes.LastIndex(log, []byte("Error releasing the state lock"))
	if i < 0 {
		return ""
	}
	j := bytes.Index(log[i:], []byte("Lock Info:"))
	if j < 0 {
		return ""
	}
	if k := bytes.Index(log[i:i+j], []byte("Error acquiring the state lock")); k >= 0 {
		return "" // the block belongs to a later failure to acquire
	}
	m := lockIDLine().FindSubmatch(log[i+j:])
	if m == nil || !validLockID().Match(m[1]) {
		return ""
	}
	return string(m[1])
}

// lockIDInFile returns the ID a local backend's lock file names, or "".
func lockIDInFile(b []byte) string {
	var info struct{ ID string }
	if json.Unmarshal(b, &info) != nil || !validLockID().MatchString(info.ID) {
		return ""
	}
	return info.ID
}

// stateLock tells what lock the interrupted stack at path (repository-relative) may hold, nil
// for none. A stack whose processes stopped by themselves (killed is false) released its lock,
// unless its log says tofu failed to; one killed after the interrupt grace holds it, with the
// ID from its log or from the local backend's lock file when either names it.
func (r *run) stateLock(path string, killed bool) *StateLock {
	id := ""
	if file, err := r.root.StackFile(path, r.o.LogFile); err == nil {
		b, _ := tailOfFile(file, lockScanBytes)
		id = lockIDInLog(b)
	}
	if id == "" && killed {
		if file, err := r.root.StackFile(path, localLockFile); err == nil {
			b, _ := tailOfFile(file, 4<<10)
			id = lockIDInFile(b)
		}
	}
	switch {
	case id == "" && !killed:
		return nil
	case id == "":
		return &StateLock{}
	}
	cmd := fmt.Sprintf("tfstackplan run %s --environment %s", r.o.Op, shellWord(r.o.Environment))
	if r.o.All {
		cmd += " --all"
	}
	return &StateLock{ID: id, Command: cmd + " --force-unlock " + id}
}

// plainWord is what a POSIX shell takes literally.
var plainWord = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9._/:@+=-]+$`) })

// shellWord quotes s for a POSIX shell unless it is plain.
func shellWord(s string) string {
	if plainWord().MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
