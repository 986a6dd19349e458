package etcdtest

import (
	"bytes"
	"encoding/binary"
	"testing"
)

func h2Frame(typ byte, stream uint32, payload string) []byte {
	h := make([]byte, h2HeaderLen, h2HeaderLen+len(payload))
	h[0], h[1], h[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	h[3] = typ
	binary.BigEndian.PutUint32(h[5:], stream)
	return append(h, payload...)
}

// chunks splits b into pieces of at most n bytes, as TCP reads may.
func chunks(b []byte, n int) [][]byte {
	var out [][]byte
	for len(b) > n {
		out = append(out, b[:n])
		b = b[n:]
	}
	return append(out, b)
}

// Invariant: whatever the chunking, the parser finds every frame header
// (type and stream) and skips the client preface and the payloads, even
// payloads that look like headers or like the preface.
func TestH2FramesScan(t *testing.T) {
	stream := bytes.Join([][]byte{
		[]byte(h2ClientPreface),
		h2Frame(0x4, 0, ""),                    // SETTINGS
		h2Frame(h2FrameHeaders, 1, "PRI *hdr"), // payload starting like the preface
		h2Frame(h2FrameData, 1, string(h2Frame(h2FrameHeaders, 9, "x"))),
		h2Frame(0x8, 0, "wind"), // WINDOW_UPDATE
		h2Frame(h2FrameHeaders, 3, ""),
	}, nil)
	want := []struct {
		typ    byte
		stream uint32
	}{{0x4, 0}, {h2FrameHeaders, 1}, {h2FrameData, 1}, {0x8, 0}, {h2FrameHeaders, 3}}
	for _, size := range []int{1, 2, 5, 9, 10, 24, 25, len(stream)} {
		var f h2Frames
		var got []struct {
			typ    byte
			stream uint32
		}
		for _, c := range chunks(stream, size) {
			f.scan(c, func(start int, typ byte, s uint32) bool {
				if start < 0 || start >= len(c) {
					t.Fatalf("chunks of %d: header start %d outside its chunk of %d", size, start, len(c))
				}
				got = append(got, struct {
					typ    byte
					stream uint32
				}{typ, s})
				return false
			})
		}
		if len(got) != len(want) {
			t.Fatalf("chunks of %d: frames %v, want %v", size, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("chunks of %d: frame %d is %v, want %v", size, i, got[i], want[i])
			}
		}
	}
}

// Invariant: the cutter lets through everything etcd sends until the
// first frame answering a request sent after arming, and corrupts from
// that frame's first byte on.
func TestReplyCutter(t *testing.T) {
	r := newReplyCutter()
	r.sent(h2Frame(0x8, 0, "wind")) // flow control opens no request
	old := h2Frame(h2FrameData, 1, "keepalive answer")
	if got := r.received(old); !bytes.Equal(got, old) {
		t.Fatal("a frame on a stream opened before arming was corrupted")
	}
	r.sent(h2Frame(h2FrameHeaders, 5, "put"))
	ping := h2Frame(0x6, 0, "12345678")
	reply := h2Frame(h2FrameHeaders, 5, "200")
	got := r.received(append(bytes.Clone(ping), reply...))
	if !bytes.Equal(got[:len(ping)], ping) {
		t.Fatal("the PING before the reply was corrupted")
	}
	for i, c := range got[len(ping):] {
		if c != 0xff {
			t.Fatalf("reply byte %d passed: %#x", i, c)
		}
	}
	if later := r.received(old); bytes.Equal(later, old) {
		t.Fatal("bytes after the cut passed")
	}
}
