package envelope_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Python's app.envelope.compression.compress(b"AAAA" / b"BBBB", "gzip" / "zstd"), and
// zlib.compress(b"AAAA").
const (
	gzipA = "1f8b0800000000000003737474740400f1080d9b04000000"
	gzipB = "1f8b08000000000000037372727202003f1bda3904000000"
	zlibA = "789c737474740400028e0105"
	zstdA = "28b52ffd200421000041414141"
	zstdB = "28b52ffd200421000042424242"
)

// TestDecompressOneMemberOrFrame: a compressed payload is one gzip member (or one zlib stream)
// or one zstd frame, and nothing after it. Go's readers concatenated a second member or frame
// (AAAABBBB) where Python reads the first only (AAAA), so one signed payload read as two
// different values; now what follows the first is refused, and a zlib stream, which Python and
// Rust read under "gzip", is read too.
func TestDecompressOneMemberOrFrame(t *testing.T) {
	for _, c := range []struct{ enc, data string }{
		{"gzip", gzipA}, {"gzip", zlibA}, {"zstd", zstdA},
	} {
		out, err := envelope.Decompress(unhex(t, c.data), c.enc, envelope.DefaultMaxDecompressed)
		if err != nil || string(out) != "AAAA" {
			t.Errorf("%s %s: got %q, %v; want AAAA", c.enc, c.data, out, err)
		}
	}
	for _, c := range []struct{ name, enc, data string }{
		{"two gzip members", "gzip", gzipA + gzipB},
		{"gzip then garbage", "gzip", gzipA + "00"},
		{"zlib then garbage", "gzip", zlibA + "6a756e6b"},
		{"two zstd frames", "zstd", zstdA + zstdB},
		{"zstd then garbage", "zstd", zstdA + "6a756e6b"},
	} {
		out, err := envelope.Decompress(unhex(t, c.data), c.enc, envelope.DefaultMaxDecompressed)
		if !errors.Is(err, prismerr.ErrCompression) {
			t.Errorf("%s: got %q, %v; want a bad_compression error", c.name, out, err)
		}
	}
}

// TestCompressRoundTripsLarge: what Compress writes (several blocks, checksums) is one member
// or frame, so the trailing-data check never refuses it; nor a frame with a checksum written
// by another encoder configuration.
func TestCompressRoundTripsLarge(t *testing.T) {
	plain := make([]byte, 700_000)
	for i := range plain {
		plain[i] = byte(i*7) ^ byte(i>>9)
	}
	for _, enc := range []string{"gzip", "snappy", "zstd"} {
		c, err := envelope.Compress(plain, enc)
		if err != nil {
			t.Fatal(err)
		}
		out, err := envelope.Decompress(c, enc, envelope.DefaultMaxDecompressed)
		if err != nil || !bytes.Equal(out, plain) {
			t.Fatalf("%s: round trip failed: %v", enc, err)
		}
	}
	w, _ := zstd.NewWriter(nil, zstd.WithEncoderCRC(true), zstd.WithSingleSegment(false), zstd.WithWindowSize(1<<17))
	framed := w.EncodeAll(bytes.Repeat([]byte("rle rle "), 100_000), nil)
	_ = w.Close()
	if out, err := envelope.Decompress(framed, "zstd", envelope.DefaultMaxDecompressed); err != nil || len(out) != 800_000 {
		t.Fatalf("checksummed multi-block frame: %d bytes, %v", len(out), err)
	}
}

// TestSnappyIsSnappyNotS2: a raw Snappy block is read as Python (cramjam) and Rust (snap) read
// it. s2.Decode also takes S2's extension - a copy with offset 0 repeats the last offset - so
// 0a04414201020100, which both refuse, read as "ABABABABAB" in Go.
func TestSnappyIsSnappyNotS2(t *testing.T) {
	// Python's compress(b"hello prism " * 50, "snappy")
	py := "d8042c68656c6c6f20707269736d20fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c00fe0c002e0c00"
	if out, err := envelope.Decompress(unhex(t, py), "snappy", 1<<20); err != nil || string(out) != strings.Repeat("hello prism ", 50) {
		t.Fatalf("Python's snappy block: %q, %v", out, err)
	}
	for _, c := range []struct{ name, data string }{
		{"S2 repeat offset", "0a04414201020100"},
		{"copy offset 0", "060441420100"},
		{"copy before the start", "0604414201ff"},
		{"declares more than it holds", "0604414201"},
		{"literal past the declared length", "02084142430a"},
		{"literal past the end", "0a2041"},
		{"over the limit", "ffffffff0f"},
		{"empty", ""},
		{"preamble only", "80"},
	} {
		out, err := envelope.Decompress(unhex(t, c.data), "snappy", 1<<20)
		if !errors.Is(err, prismerr.ErrCompression) {
			t.Errorf("%s (%s): got %q, %v; want a bad_compression error", c.name, c.data, out, err)
		}
	}
	if out, err := envelope.Decompress([]byte{0}, "snappy", 1<<20); err != nil || len(out) != 0 {
		t.Errorf("an empty block: %q, %v", out, err)
	}
}
