package etcdtest

import (
	"bytes"
	"encoding/binary"
	"sync"

	"golang.org/x/net/http2"
)

// HTTP/2 frame layout (RFC 9113 §4.1): a 9-byte header of length (24 bits),
// type, flags and stream ID (31 bits), then length bytes of payload. A
// client connection opens with http2.ClientPreface.
const (
	h2HeaderLen     = 9
	h2FrameData     = byte(http2.FrameData)
	h2FrameHeaders  = byte(http2.FrameHeaders)
	h2ClientPreface = http2.ClientPreface
)

// h2Frames follows the frame boundaries of one direction of a plaintext
// HTTP/2 connection, across the chunks the proxy copies.
type h2Frames struct {
	hdr  []byte // a frame header read in part so far
	skip int    // payload bytes of the current frame still to pass
}

// scan feeds b to the parser and calls frame for each frame header that
// completes in b, with the index in b where that header started (0 if it
// started in an earlier chunk). If frame returns true, scan stops there.
func (f *h2Frames) scan(b []byte, frame func(start int, typ byte, stream uint32) bool) {
	for i := 0; i < len(b); {
		if f.skip > 0 {
			n := min(f.skip, len(b)-i)
			f.skip -= n
			i += n
			continue
		}
		if len(f.hdr) == 0 && b[i] == h2ClientPreface[0] {
			// A new connection's client preface, not a frame ('P' as a
			// frame's first byte would mean a 5 MB frame, which gRPC
			// never sends): pass it.
			f.skip = len(h2ClientPreface)
			continue
		}
		start := i
		if len(f.hdr) > 0 {
			start = 0 // the header began in an earlier chunk
		}
		n := min(h2HeaderLen-len(f.hdr), len(b)-i)
		f.hdr = append(f.hdr, b[i:i+n]...)
		i += n
		if len(f.hdr) < h2HeaderLen {
			continue
		}
		h := f.hdr
		f.skip = int(h[0])<<16 | int(h[1])<<8 | int(h[2])
		typ, stream := h[3], binary.BigEndian.Uint32(h[5:9])&0x7fffffff
		f.hdr = f.hdr[:0]
		if frame(start, typ, stream) {
			return
		}
	}
}

// replyCutter loses the replies of requests sent after it was armed: it
// watches the client's frames for the streams (requests) they open, and
// from the first reply frame on one of those streams it corrupts every byte
// etcd sends, so the client drops the connection without reading the
// reply. Frames before that (an earlier request's reply, a window update, a
// keepalive answer on an older stream) pass unharmed, so the request itself
// always reaches etcd.
//
// One replyCutter serves every connection of a proxy; it assumes one client
// connection carries the request, as a client dialling one endpoint does.
type replyCutter struct {
	mu       sync.Mutex
	tx, rx   h2Frames
	requests map[uint32]bool
	cut      bool
}

func newReplyCutter() *replyCutter { return &replyCutter{requests: map[uint32]bool{}} }

// sent is the proxy's ModifyTx: client to etcd.
func (r *replyCutter) sent(b []byte) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tx.scan(b, func(_ int, typ byte, stream uint32) bool {
		if typ == h2FrameHeaders && stream != 0 {
			r.requests[stream] = true
		}
		return false
	})
	return b
}

// received is the proxy's ModifyRx: etcd to the client.
func (r *replyCutter) received(b []byte) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	from := len(b)
	if r.cut {
		from = 0
	} else {
		r.rx.scan(b, func(start int, typ byte, stream uint32) bool {
			if (typ == h2FrameHeaders || typ == h2FrameData) && r.requests[stream] {
				r.cut, from = true, start
				return true
			}
			return false
		})
	}
	if from == len(b) {
		return b
	}
	out := bytes.Clone(b)
	for i := from; i < len(out); i++ {
		out[i] = 0xff
	}
	return out
}
