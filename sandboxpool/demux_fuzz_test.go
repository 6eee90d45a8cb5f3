package sandboxpool

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/moby/moby/api/pkg/stdcopy"
)

// FuzzDemux fuzzes the demultiplexing of a container's attached stream (the SDK's
// stdcopy, as spawn uses it). Arbitrary bytes (with frames of at most 1 MiB, see
// smallFrames) must never panic it; a stream framed
// from fuzzed chunks must come out whole, stream 1 apart from stream 2.
func FuzzDemux(f *testing.F) {
	f.Add([]byte("\x01\x00\x00\x00\x00\x00\x00\x05hello"), []byte("ab"), uint8(3))
	f.Add([]byte("\x02\x00\x00\x00\x00\x00\x01\x00"), []byte{}, uint8(0))
	f.Add([]byte{}, []byte("{\"type\":\"ready\"}\n"), uint8(255))
	f.Fuzz(func(t *testing.T, raw, payload []byte, pattern uint8) {
		var out, errOut bytes.Buffer
		if smallFrames(raw) {
			_, _ = stdcopy.StdCopy(&out, &errOut, bytes.NewReader(raw)) // must not panic
		}

		// Frame payload in chunks, alternating streams by pattern's bits.
		var framed, want1, want2 bytes.Buffer
		for i, rest := 0, payload; len(rest) > 0; i++ {
			n := min(len(rest), 1+int(pattern)%7+i%5)
			stream := byte(1)
			if pattern>>(i%8)&1 == 1 {
				stream = 2
			}
			hdr := [8]byte{stream}
			binary.BigEndian.PutUint32(hdr[4:], uint32(n))
			framed.Write(hdr[:])
			framed.Write(rest[:n])
			if stream == 1 {
				want1.Write(rest[:n])
			} else {
				want2.Write(rest[:n])
			}
			rest = rest[n:]
		}
		out.Reset()
		errOut.Reset()
		if _, err := stdcopy.StdCopy(&out, &errOut, &framed); err != nil {
			t.Fatalf("a well-framed stream: %v", err)
		}
		if !bytes.Equal(out.Bytes(), want1.Bytes()) || !bytes.Equal(errOut.Bytes(), want2.Bytes()) {
			t.Fatalf("stream 1 = %q, want %q; stream 2 = %q, want %q", out.Bytes(), want1.Bytes(), errOut.Bytes(), want2.Bytes())
		}
	})
}

// smallFrames reports whether every frame header in b announces at most 1 MiB.
// stdcopy allocates what a header announces; the headers come from the Docker daemon,
// which frames what it read in small chunks, never from the container, so the fuzzer
// need not spend gigabytes on them.
func smallFrames(b []byte) bool {
	for len(b) >= 8 {
		n := binary.BigEndian.Uint32(b[4:8])
		if n > 1<<20 {
			return false
		}
		b = b[min(len(b), 8+int(n)):]
	}
	return true
}
