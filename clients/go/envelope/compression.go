package envelope

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"io"

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
		n, err := s2.DecodedLen(data)
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "snappy preamble is not valid", Path: "payload"}).Wrap(err)
		}
		if n > maxSize {
			return nil, tooBig()
		}
		out, err := s2.Decode(nil, data)
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "snappy payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		return out, nil
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
