package gateway

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzSSEState feeds arbitrary streams to the parser that follows a
// Messages stream for its usage and end: it never panics, and a stream
// without a message_stop event is never taken as ended.
func FuzzSSEState(f *testing.F) {
	f.Add([]byte("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":12,\"output_tokens\":1}}}\n\nevent: message_delta\ndata: {\"usage\":{\"output_tokens\":9}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"))
	f.Add([]byte("event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n"))
	f.Add([]byte("event: message_delta\ndata: {\"usage\":null}\n\nevent: error\ndata: [\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s sseState
		br := bufio.NewReaderSize(bytes.NewReader(b), 16)
		for {
			line, err := br.ReadSlice('\n')
			for err == bufio.ErrBufferFull {
				s.partial(line)
				line, err = br.ReadSlice('\n')
			}
			if len(line) > 0 {
				s.line(line)
			}
			if err != nil {
				break
			}
		}
		if s.stopped && !bytes.Contains(b, []byte("message_stop")) {
			t.Errorf("ended without message_stop: %q", b)
		}
		if s.usage.OutputTokens < 0 && !bytes.Contains(b, []byte("-")) {
			t.Errorf("negative output from %q", b)
		}
	})
}
