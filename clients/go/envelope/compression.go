package envelope

import (
	"bytes"
	"compress/gzip"
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
	switch encoding {
	case "", "none", "identity":
		return data, nil
	case "gzip":
		r, err := gzip.NewReader(bytes.NewReader(data))
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "gzip payload is invalid: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		out, err := io.ReadAll(io.LimitReader(r, int64(maxSize)+1))
		if err != nil {
			return nil, (&prismerr.Error{Code: "bad_compression", What: "gzip payload is invalid or truncated: " + err.Error(), Path: "payload"}).Wrap(err)
		}
		if len(out) > maxSize {
			return nil, tooBig()
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
