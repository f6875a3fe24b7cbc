package runner

// This file is the reading of a stack's log: following the file at its path, telling an
// append from a truncation or a replacement (generations), and turning the bytes read into
// masked chunks and gap records (see Offsets, Generations and Reading in pump.go).

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
)

// full reports whether an open chunk has no room left for another read.
func (s *stackTail) full(it *pumpItem) bool {
	return it.rawLen+int64(len(s.ms.hold)) >= int64(s.p.opts.MaxChunk)
}

// pread reads exactly len(b) bytes at off, or reports false.
func (s *stackTail) pread(b []byte, off int64) bool {
	n, err := s.f.ReadAt(b, off)
	return n == len(b) && (err == nil || errors.Is(err, io.EOF))
}

// sameBytesAt reports whether the file still holds want at off.
func (s *stackTail) sameBytesAt(want []byte, off int64) bool {
	if len(want) == 0 {
		return true
	}
	got := make([]byte, len(want))
	return s.pread(got, off) && bytes.Equal(got, want)
}

// unchanged reports whether the bytes of this generation the pump already looked at are still
// there: the bytes just before the read position, or the head of the file before any was read.
func (s *stackTail) unchanged() bool {
	if len(s.anchor) > 0 {
		return s.sameBytesAt(s.anchor, s.readOff-int64(len(s.anchor)))
	}
	return s.sameBytesAt(s.head, 0)
}

// observe looks at the file: it opens it when it appears, detects a new generation
// (truncation, rewrite, replacement) and records the size.
func (s *stackTail) observe() {
	defer func() {
		s.obsGen.Store(s.gen)
		s.obsSize.Store(s.seen)
	}()
	if s.f != nil && !s.pathChanged.Swap(false) && !s.polled.Load() {
		// Watched, and only writes happened: the open file is still the one at the path.
		if fi, err := s.f.Stat(); err == nil {
			s.checkSize(fi.Size())
			return
		}
	}
	if s.f != nil {
		// The file the pump has open is still at the path it was resolved to.
		if li, err := os.Lstat(s.path); err == nil && os.SameFile(s.fi, li) {
			s.checkSize(li.Size())
			return
		}
	}
	if s.f == nil && s.earlier != nil {
		if s.asEarlier() {
			return // nothing of it is posted
		}
		s.earlier = nil
	}
	if s.f == nil && s.absent != "" {
		// Still absent at its path, links on the way followed as they are now (a link repointed
		// since is followed to where it points now): nothing to open, and no need to walk the
		// stack path again on every look at an idle stack. Anything found there is resolved in
		// full before it is opened.
		if _, err := os.Lstat(s.absent); errors.Is(err, fs.ErrNotExist) {
			s.checkDirGone(err)
			return
		}
		s.absent = ""
	}
	// Absent, replaced or never opened: resolve the path again before opening anything.
	path, li, err := s.p.root.stackFileInfo(s.name, s.p.file)
	if err != nil {
		s.complain(err)
		s.checkDirGone(err)
		s.statOpen()
		return
	}
	if li == nil { // nothing at the path
		if s.f == nil {
			s.absent = filepath.Join(s.p.root.real, filepath.FromSlash(s.name), filepath.FromSlash(s.p.file))
		}
		s.checkDirGone(fs.ErrNotExist)
		s.statOpen()
		return
	}
	s.path = path
	if s.f == nil || !os.SameFile(s.fi, li) {
		f, fi, err := openResolved(path)
		if err != nil {
			s.complain(err)
			s.statOpen()
			return
		}
		if s.f != nil {
			// Replaced: the old inode is still readable, and its size is exact.
			lost := s.seen
			if oi, err := s.f.Stat(); err == nil {
				lost = max(lost, oi.Size())
			}
			_ = s.f.Close()
			s.endGeneration(lost)
		} else {
			s.gen = s.firstGen
		}
		s.f, s.fi = f, fi
		s.seen = fi.Size()
		s.captureHead()
		return
	}
	s.checkSize(li.Size())
}

// checkDirGone makes a watched stack polled when its log is missing because its directory is
// gone. The directory's watch says nothing more then: not even that the directory went away,
// while the pump still has the old log inside it open (that keeps the directory's inode, so
// the kernel sends no delete event for it).
func (s *stackTail) checkDirGone(err error) {
	if !errors.Is(err, fs.ErrNotExist) || s.polled.Load() {
		return
	}
	if _, derr := os.Stat(s.watchDir); errors.Is(derr, fs.ErrNotExist) {
		s.p.markPolled(s)
	}
}

// complain records, once per stack, why its log file cannot be used (a missing file is not a
// problem: it may appear later).
func (s *stackTail) complain(err error) {
	if s.refused || errors.Is(err, fs.ErrNotExist) {
		return
	}
	s.refused = true
	if errors.Is(err, ErrPathEscapes) {
		s.errs = append(s.errs, fmt.Sprintf("stack %q: log file refused: %v", s.name, err))
		return
	}
	s.errs = append(s.errs, fmt.Sprintf("stack %q: log file unreadable: %v", s.name, err))
}

// statOpen updates the size from the open file when the path is gone or unusable (a deleted
// file can still be read through its descriptor).
func (s *stackTail) statOpen() {
	if s.f == nil {
		return
	}
	if fi, err := s.f.Stat(); err == nil {
		s.checkSize(fi.Size())
	}
}

// checkSize records size, starting a new generation when the file was truncated or rewritten.
func (s *stackTail) checkSize(size int64) {
	if size < s.seen || size < s.readOff || !s.unchanged() {
		s.endGeneration(s.seen)
		// size was taken before the content check; the new generation may already be larger
		// or smaller.
		size = 0
		if fi, err := s.f.Stat(); err == nil {
			size = fi.Size()
		}
	}
	s.seen = max(s.seen, size)
	s.captureHead()
}

// captureHead remembers the first bytes of the generation once they exist.
func (s *stackTail) captureHead() {
	if len(s.head) >= headLen || s.seen <= int64(len(s.head)) {
		return
	}
	h := make([]byte, min(int64(headLen), s.seen))
	if !s.pread(h, 0) || !bytes.Equal(h[:len(s.head)], s.head) {
		return
	}
	s.head = h
}

// endGeneration closes the current generation: held-back bytes are flushed as its last chunk
// (or counted lost when the stack is already behind), bytes up to lostTo that were never read
// become a gap, and the next generation starts at offset 0.
func (s *stackTail) endGeneration(lostTo int64) {
	from := s.readOff
	if len(s.ms.hold) > 0 {
		if s.openItem() == nil && s.dataItems() >= 2 {
			from = s.emitOff // already behind: the held-back bytes go with the loss
		} else {
			// Small (bounded by the hold-back), so it is not charged to the budget.
			c, out := s.ms.cut(s.ms.window(0), true)
			s.enqueueData(out, c, 0)
		}
	}
	s.seal()
	if lostTo > from {
		s.addGap(from, lostTo)
	}
	s.ms.reset()
	s.gen++
	s.readOff, s.emitOff, s.sendOff, s.seen = 0, 0, 0, 0
	s.head, s.anchor = nil, nil
}

// addGap records the loss of file bytes [from, to), which start at emitOff (held-back bytes
// were flushed or are part of the loss), and queues its gap record.
func (s *stackTail) addGap(from, to int64) {
	at := s.sendOff
	s.sendOff += to - from
	s.gaps = append(s.gaps, StackGap{Stack: s.name, Generation: s.gen, From: at, To: s.sendOff})
	queued, oldest := 0, -1
	for i, it := range s.queue {
		if it.lc.GapLength > 0 {
			queued++
			if oldest < 0 && !(i == 0 && s.inflight) {
				oldest = i
			}
		}
	}
	if queued >= maxQueuedGaps && oldest >= 0 {
		// The oldest record is not posted; it stays in the DrainReport as unreported.
		s.queue = append(s.queue[:oldest], s.queue[oldest+1:]...)
	}
	s.queue = append(s.queue, &pumpItem{
		lc:     events.LogChunk{ExecutionID: s.p.execID, Stack: s.name, Generation: s.gen, Offset: at, GapLength: to - from},
		gapIdx: len(s.gaps) - 1,
	})
}

// dataItems counts the data chunks queued.
func (s *stackTail) dataItems() int {
	n := 0
	for _, it := range s.queue {
		if it.lc.GapLength == 0 {
			n++
		}
	}
	return n
}

// openItem returns the open chunk at the tail of the queue, if any.
func (s *stackTail) openItem() *pumpItem {
	if n := len(s.queue); n > 0 && s.queue[n-1].open {
		return s.queue[n-1]
	}
	return nil
}

// seal closes the open chunk: it is posted as it is from now on.
func (s *stackTail) seal() {
	if it := s.openItem(); it != nil {
		it.open = false
	}
}

// enqueueData appends masked bytes covering rawLen file bytes to the open chunk, opening one
// when there is none.
func (s *stackTail) enqueueData(out []byte, rawLen int, cost int64) {
	it := s.openItem()
	if it == nil {
		it = &pumpItem{
			lc:     events.LogChunk{ExecutionID: s.p.execID, Stack: s.name, Generation: s.gen, Offset: s.sendOff},
			open:   true,
			opened: time.Now(),
		}
		s.queue = append(s.queue, it)
	}
	if it.lc.Data == nil {
		it.lc.Data = out
	} else {
		it.lc.Data = append(it.lc.Data, out...)
	}
	it.rawLen += int64(rawLen)
	it.cost += cost
	s.emitOff += int64(rawLen)
	s.sendOff += int64(len(out))
}

// fill reads what was appended into the open chunk (opening one if at most one sealed chunk
// waits), as far as the chunk size and the byte budget allow; draining, it also flushes the
// held-back bytes at the end of the file.
func (s *stackTail) fill(draining bool) {
	if s.f == nil {
		return
	}
	open := s.openItem()
	if open == nil && s.dataItems() >= 2 {
		return
	}
	avail := s.seen - s.readOff
	if avail <= 0 {
		if draining && len(s.ms.hold) > 0 {
			// Small (bounded by the hold-back), so it is not charged to the budget.
			c, out := s.ms.cut(s.ms.window(0), true)
			s.enqueueData(out, c, 0)
		}
		return
	}
	room := int64(s.p.opts.MaxChunk - len(s.ms.hold))
	if open != nil {
		room -= open.rawLen
		if room <= 0 {
			return
		}
	} else {
		room = max(room, 512) // a long hold-back must not stall the stream
	}
	n := min(avail, room)
	if s.granted == 0 {
		if s.waiter != nil {
			return
		}
		ok, w := s.p.budget.acquire(n)
		if !ok {
			s.waiter = w
			return
		}
		s.granted = n
	}
	n = min(n, s.granted)
	w := s.ms.window(int(n))
	if !s.pread(w[len(w)-int(n):], s.readOff) || !s.unchanged() {
		// Truncated or rewritten under us: what was read may belong to the next generation.
		s.endGeneration(s.seen)
		return
	}
	s.readOff += n
	s.anchor = bytes.Clone(w[max(0, len(w)-anchorLen):])
	if len(s.anchor) > int(s.readOff) {
		s.anchor = s.anchor[len(s.anchor)-int(s.readOff):]
	}
	c, out := s.ms.cut(w, draining && s.readOff >= s.seen)
	granted := s.granted
	s.granted = 0
	if c == 0 {
		s.p.budget.release(granted)
		return
	}
	cost := int64(len(out))
	s.p.budget.adjust(granted, cost) // a masked chunk can be a little larger than what was read
	s.enqueueData(out, c, cost)
}
