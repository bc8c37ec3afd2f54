package workload

import (
	"bufio"
	"bytes"
	"io"
)

// MaxLineBytes is the default limit on one request line: 32 MiB, the
// Messages API's request size limit. A longer line cannot be sent; it is
// reported, and reading skips to its end without holding it in memory.
const MaxLineBytes = 32 << 20

// readBufSize is the read buffer. Lines up to this size are parsed in place
// in the buffer; longer ones are assembled in a second buffer, grown only as
// far as the longest such line (and never beyond the limit).
const readBufSize = 1 << 20

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// lineReader splits a stream into lines and tracks each line's byte offset
// and 1-based number. A line's bytes exclude the "\n" and a "\r" before it;
// a UTF-8 BOM at the start of the stream is skipped.
type lineReader struct {
	br   *bufio.Reader
	max  int
	off  int64 // offset of the next unread byte
	num  int64 // number of the last line returned
	long []byte
	eof  bool
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{br: bufio.NewReaderSize(r, readBufSize), max: max}
}

// grow makes room for n more bytes in b, doubling (so the bytes copied stay
// linear in the line) but never past the limit plus a "\r\n".
func (r *lineReader) grow(b []byte, n int) []byte {
	if len(b)+n <= cap(b) {
		return b
	}
	c := min(max(2*cap(b), len(b)+n), r.max+2)
	nb := make([]byte, len(b), c)
	copy(nb, b)
	return nb
}

// rawLine is one line. b is valid until the next call to next.
type rawLine struct {
	b       []byte
	off     int64 // offset of b[0] in the stream
	num     int64 // 1-based line number
	tooLong bool  // longer than the limit; b is nil
	size    int64 // bytes of the line without its line ending
}

// next returns the next line, or io.EOF after the last one.
func (r *lineReader) next() (rawLine, error) {
	if r.eof {
		return rawLine{}, io.EOF
	}
	start := r.off
	frag, err := r.br.ReadSlice('\n')
	r.off += int64(len(frag))
	b := frag
	tooLong := false
	if err == bufio.ErrBufferFull {
		// A long line: assemble it, up to the limit plus a "\r\n".
		r.long = append(r.long[:0], frag...)
		for err == bufio.ErrBufferFull {
			frag, err = r.br.ReadSlice('\n')
			r.off += int64(len(frag))
			if !tooLong && len(r.long)+len(frag) > r.max+2 {
				tooLong = true
				r.long = r.long[:0]
			}
			if !tooLong {
				r.long = r.grow(r.long, len(frag))
				r.long = append(r.long, frag...)
			}
		}
		b = r.long
	}
	hasNL := err == nil
	switch err {
	case nil:
	case io.EOF:
		r.eof = true
		if r.off == start {
			return rawLine{}, io.EOF
		}
	default:
		return rawLine{}, err
	}
	r.num++
	end := r.off // end of the line's bytes, line ending excluded
	if hasNL {
		end--
		if !tooLong {
			b = b[:len(b)-1]
		}
	}
	if tooLong {
		// We do not know whether the dropped bytes ended in '\r'; only the
		// size matters for the message.
		return rawLine{off: start, num: r.num, tooLong: true, size: end - start}, nil
	}
	if len(b) > 0 && b[len(b)-1] == '\r' {
		b = b[:len(b)-1]
	}
	if start == 0 && bytes.HasPrefix(b, utf8BOM) {
		b = b[len(utf8BOM):]
		start = int64(len(utf8BOM))
	}
	if len(b) > r.max {
		return rawLine{off: start, num: r.num, tooLong: true, size: int64(len(b))}, nil
	}
	return rawLine{b: b, off: start, num: r.num, size: int64(len(b))}, nil
}
