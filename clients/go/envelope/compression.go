package envelope

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"
	"math"

	"github.com/klauspost/compress/s2"
	"github.com/klauspost/compress/zstd"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// DefaultMaxDecompressed caps what a compressed payload may inflate to (64 MiB, as in
// Python's app/envelope/compression.py): a small hostile payload cannot exhaust memory.
const DefaultMaxDecompressed = 64 * 1024 * 1024

// Compress compresses data per a content_encoding name ("", "none", "identity", "gzip",
// "snappy" raw block format, "zstd").
func Compress(data []byte, encoding string) ([]byte, error) {
	switch encoding {
	case "", "none", "identity":
		return data, nil
	case "gzip":
		var buf bytes.Buffer
		w, _ := gzip.NewWriterLevel(&buf, 6)
		_, _ = w.Write(data)
		_ = w.Close()
		return buf.Bytes(), nil
	case "snappy":
		return s2.EncodeSnappy(nil, data), nil
	case "zstd":
		enc, _ := zstd.NewWriter(nil)
		defer enc.Close()
		return enc.EncodeAll(data, nil), nil
	}
	return nil, prismerr.New("bad_compression", "unknown content_encoding "+quote(encoding),
		"use none, gzip, snappy or zstd").At("metadata.content_encoding")
}

// Decompress reverses Compress, refusing output above maxSize bytes.
func Decompress(data []byte, encoding string, maxSize int) ([]byte, error) {
	tooBig := func() error {
		return prismerr.Newf("bad_compression", "%s payload inflates beyond the %d-byte limit", encoding, maxSize).At("payload")
	}
	trailing := func(n int) error {
		return prismerr.Newf("bad_compression", "%s payload has %d bytes after its compressed data (a second member or frame, or garbage)", encoding, n).
			At("payload").WithHint("compress the payload as one gzip member or one zstd frame")
	}
	switch encoding {
	case "", "none", "identity":
		return data, nil
	case "gzip":
		// One gzip member, or one zlib stream (Python's decoder, wbits 47, takes both; so does
		// Rust's), and nothing after it: a second member or trailing bytes would be read by one
		// runtime and not by another (Go's reader concatenated members Python ignores), so the
		// same signed payload could mean two things.
		br := bytes.NewReader(data)
		var r io.Reader
		if len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b {
			g, err := gzip.NewReader(br)
			if err != nil {
				return nil, (&prismerr.Error{Code: "bad_compression", What: "gzip payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
			}
			g.Multistream(false)
			r = g
		} else {
			z, err := zlib.NewReader(br)
			if err != nil {
				return nil, (&prismerr.Error{Code: "bad_compression", What: "gzip payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
			}
			r = z
		}
		out, err := io.ReadAll(io.LimitReader(r, int64(maxSize)+1))
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "gzip payload is invalid or truncated: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		if len(out) > maxSize {
			return nil, tooBig()
		}
		if br.Len() != 0 { // the readers take bytes.Reader as an io.ByteReader: no read-ahead
			return nil, trailing(br.Len())
		}
		return out, nil
	case "snappy":
		return snappyDecode(data, maxSize)
	case "zstd":
		// One frame and nothing after it (see gzip): Go's decoder reads every frame, Python's
		// and Rust's the first only.
		if n, ok := zstdFrameLen(data); ok && n < len(data) {
			return nil, trailing(len(data) - n)
		}
		dec, err := zstd.NewReader(bytes.NewReader(data), zstd.WithDecoderMaxMemory(uint64(maxSize)+1), zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "zstd payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		defer dec.Close()
		out, err := io.ReadAll(io.LimitReader(dec, int64(maxSize)+1))
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "zstd payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		if len(out) > maxSize {
			return nil, tooBig()
		}
		return out, nil
	}
	return nil, prismerr.New("bad_compression", "unknown content_encoding "+quote(encoding),
		"the producer used an encoding this client does not implement").At("metadata.content_encoding")
}

// zstdFrameLen is the length of the zstd frame data starts with (frame header, blocks, the
// optional checksum), walked from the block headers without decoding; false when data does not
// start with a whole regular frame (the decoder then reports what is wrong).
func zstdFrameLen(data []byte) (int, bool) {
	var h zstd.Header
	if err := h.Decode(data); err != nil || h.Skippable {
		return 0, false
	}
	pos := h.HeaderSize
	for {
		if len(data)-pos < 3 {
			return 0, false
		}
		bh := int(data[pos]) | int(data[pos+1])<<8 | int(data[pos+2])<<16
		pos += 3
		size := bh >> 3
		switch (bh >> 1) & 3 {
		case 1: // RLE: one byte repeated size times
			size = 1
		case 3: // reserved
			return 0, false
		}
		if len(data)-pos < size {
			return 0, false
		}
		pos += size
		if bh&1 == 1 {
			break
		}
	}
	if h.HasCheckSum {
		pos += 4
	}
	if pos > len(data) {
		return 0, false
	}
	return pos, true
}

// snappyDecode reads a raw Snappy block (the format Python's cramjam and Rust's snap read),
// strictly: s2.Decode also reads S2's extensions (a copy with offset 0 repeats the last offset),
// so bytes Python and Rust refuse decoded to a value in Go. The declared length is checked
// against maxSize before anything is allocated, and the block must produce exactly it.
func snappyDecode(src []byte, maxSize int) ([]byte, error) {
	corrupt := func(what string) error {
		return prismerr.New("bad_compression", "snappy payload is invalid: "+what, "").At("payload")
	}
	n, pos, err := ReadVarint(src, 0)
	if err != nil || n > math.MaxUint32 {
		return nil, corrupt("the preamble is not a valid length")
	}
	if n > uint64(maxSize) {
		return nil, prismerr.Newf("bad_compression", "snappy payload declares %d bytes, over the %d-byte limit", n, maxSize).At("payload")
	}
	dst := make([]byte, 0, int(n))
	for pos < len(src) {
		tag := src[pos]
		pos++
		var length, offset int
		switch tag & 3 {
		case 0: // literal
			length = int(tag >> 2)
			if length >= 60 {
				k := length - 59 // 1-4 little-endian length bytes
				if len(src)-pos < k {
					return nil, corrupt("literal length runs past the end")
				}
				length = 0
				for i := k - 1; i >= 0; i-- {
					length = length<<8 | int(src[pos+i])
				}
				pos += k
			}
			length++
			if length <= 0 || len(src)-pos < length || int(n)-len(dst) < length {
				return nil, corrupt("literal runs past the end of the input or the declared length")
			}
			dst = append(dst, src[pos:pos+length]...)
			pos += length
			continue
		case 1: // copy, 1-byte offset
			if len(src)-pos < 1 {
				return nil, corrupt("copy runs past the end")
			}
			length = 4 + int(tag>>2&7)
			offset = int(tag&0xe0)<<3 | int(src[pos])
			pos++
		case 2: // copy, 2-byte offset
			if len(src)-pos < 2 {
				return nil, corrupt("copy runs past the end")
			}
			length = 1 + int(tag>>2)
			offset = int(src[pos]) | int(src[pos+1])<<8
			pos += 2
		default: // copy, 4-byte offset
			if len(src)-pos < 4 {
				return nil, corrupt("copy runs past the end")
			}
			length = 1 + int(tag>>2)
			offset = int(uint32(src[pos]) | uint32(src[pos+1])<<8 | uint32(src[pos+2])<<16 | uint32(src[pos+3])<<24)
			pos += 4
		}
		if offset <= 0 || offset > len(dst) || int(n)-len(dst) < length {
			return nil, corrupt("copy offset " + itoa(offset) + " or length " + itoa(length) + " is out of range")
		}
		if offset >= length {
			dst = append(dst, dst[len(dst)-offset:len(dst)-offset+length]...)
			continue
		}
		for i := 0; i < length; i++ { // byte by byte: this copy overlaps what it writes
			dst = append(dst, dst[len(dst)-offset])
		}
	}
	if len(dst) != int(n) {
		return nil, corrupt("the block decodes to " + itoa(len(dst)) + " bytes, not the " + u64toa(n) + " it declares")
	}
	return dst, nil
}
