// Package tickline is the format of the hand-off between `tfstackplan run tick` and the
// driver that started the scripts: under `run plan|apply` each tick appends one JSON line to a
// file in the directory the driver names in TFSTACKPLAN_TICK_DIR, and the driver relays what
// it reads there to the control plane. internal/tickfile appends the lines.
//
// The early tick path (internal/earlytick) uses this package, and is initialized as soon as
// its imports are (see there). So the package imports nothing with initialization work, only
// unicode/utf8: one more import, even strconv or path/filepath, can make the early tick wait
// for dozens of other packages.
package tickline

import "unicode/utf8"

// EnvDir names the directory where ticks are recorded for the driver (set by `run plan|apply`,
// one directory per script run).
const EnvDir = "TFSTACKPLAN_TICK_DIR"

// Name is the file in EnvDir that ticks are appended to, one JSON object a line.
const Name = "ticks.jsonl"

// MaxField bounds each field of a recorded tick in bytes, so one append stays one small write.
const MaxField = 1024

// Record is one line of the tick file.
type Record struct {
	Stack   string `json:"stack"`
	Phase   string `json:"phase"`
	Status  string `json:"status,omitempty"`
	Message string `json:"message,omitempty"`
	At      int64  `json:"at"` // unix nanoseconds
}

// Clip cuts s to MaxField bytes. A rune cut in half is encoded as U+FFFD, as any invalid UTF-8.
func Clip(s string) string {
	if len(s) > MaxField {
		return s[:MaxField]
	}
	return s
}

// AppendJSON appends r as one JSON object to b: exactly the bytes encoding/json's Marshal
// produces for a Record (field order, omitempty, HTML-safe escapes, U+FFFD for invalid
// UTF-8), without importing it.
func (r Record) AppendJSON(b []byte) []byte {
	b = append(b, `{"stack":`...)
	b = appendString(b, r.Stack)
	b = append(b, `,"phase":`...)
	b = appendString(b, r.Phase)
	if r.Status != "" {
		b = append(b, `,"status":`...)
		b = appendString(b, r.Status)
	}
	if r.Message != "" {
		b = append(b, `,"message":`...)
		b = appendString(b, r.Message)
	}
	b = append(b, `,"at":`...)
	b = appendInt(b, r.At)
	return append(b, '}')
}

// appendInt appends n in decimal, as strconv.AppendInt(b, n, 10) does.
func appendInt(b []byte, n int64) []byte {
	u := uint64(n)
	if n < 0 {
		b = append(b, '-')
		u = -u // two's complement: right for math.MinInt64 too
	}
	var digits [20]byte
	i := len(digits)
	for {
		i--
		digits[i] = byte('0' + u%10)
		u /= 10
		if u == 0 {
			break
		}
	}
	return append(b, digits[i:]...)
}

const hex = "0123456789abcdef"

// appendString appends s as a JSON string the way encoding/json does by default.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default: // other control characters and the HTML-sensitive <, >, &
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 end lines in JavaScript; encoding/json escapes them.
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// Line returns r (fields clipped to MaxField) as one line of the tick file, newline included.
func Line(r Record) []byte {
	r.Stack, r.Phase, r.Status, r.Message = Clip(r.Stack), Clip(r.Phase), Clip(r.Status), Clip(r.Message)
	return append(r.AppendJSON(make([]byte, 0, 128)), '\n')
}

// Path returns the tick file's path in dir. A slash: every system Go runs on takes it.
func Path(dir string) string { return dir + "/" + Name }
