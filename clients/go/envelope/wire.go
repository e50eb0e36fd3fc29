package envelope

import (
	"math"
	"strconv"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Wire types of the protobuf encoding.
const (
	WireVarint = 0
	WireI64    = 1
	WireLen    = 2
	WireI32    = 5
)

const maxField = 1<<29 - 1

// Record is one top-level protobuf record: data[Start:End] is the whole record (tag
// included); for length-delimited records data[ValueStart:End] is the value.
//
// The codec, the header-only parse and signature verification all work on records
// rather than on a parsed message: the payload is skipped by its length prefix (never
// touched), and signatures are cut from the received bytes (docs/signing.md).
type Record struct {
	Field      int
	WireType   int
	Start      int
	ValueStart int
	End        int
}

// ReadVarint decodes a base-128 varint at pos and returns the value and the position after
// it. A varint longer than 10 bytes is an error; one whose value does not fit in 64 bits
// saturates to math.MaxUint64 (Python reads it as a larger integer), so it can never alias
// a small value such as a signature scope.
func ReadVarint(buf []byte, pos int) (uint64, int, error) {
	var result uint64
	overflow := false
	for shift := uint(0); ; shift += 7 {
		if shift >= 70 {
			return 0, pos, prismerr.New("bad_length", "varint longer than 10 bytes", "").At(byteAt(pos))
		}
		if pos >= len(buf) {
			return 0, pos, prismerr.New("truncated", "varint runs past the end of the input", "").At(byteAt(pos))
		}
		b := buf[pos]
		pos++
		part := uint64(b & 0x7f)
		if shift == 63 && part > 1 || shift > 63 && part != 0 {
			overflow = true
		}
		result |= part << shift
		if b < 0x80 {
			if overflow {
				return math.MaxUint64, pos, nil
			}
			return result, pos, nil
		}
	}
}

// AppendVarint appends the minimal varint encoding of v.
func AppendVarint(dst []byte, v uint64) []byte {
	for v >= 0x80 {
		dst = append(dst, byte(v)|0x80)
		v >>= 7
	}
	return append(dst, byte(v))
}

// VarintSize is the length of v's minimal varint encoding.
func VarintSize(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

func byteAt(pos int) string { return "byte " + itoa(pos) }

func itoa(n int) string { return strconv.Itoa(n) }

// Scan returns every record of one message in buf, without copying anything. It rejects
// groups and invalid wire types, field number 0 and numbers above 2^29-1, varints longer
// than 10 bytes and lengths that run past the end (docs/signing.md, step 1).
func Scan(buf []byte) ([]Record, error) {
	out := make([]Record, 0, 8)
	pos, end := 0, len(buf)
	for pos < end {
		start := pos
		key, p, err := ReadVarint(buf, pos)
		if err != nil {
			return nil, err
		}
		pos = p
		field, wt := key>>3, int(key&7)
		if field == 0 || field > maxField {
			return nil, prismerr.Newf("wire_type", "invalid field number %d", field).At(byteAt(start))
		}
		f := int(field)
		switch wt {
		case WireLen:
			length, vs, err := ReadVarint(buf, pos)
			if err != nil {
				return nil, err
			}
			if length > uint64(end-vs) {
				return nil, &prismerr.Error{Code: "truncated",
					What: "field " + itoa(f) + " claims " + u64toa(length) + " bytes but only " + itoa(end-vs) + " remain",
					Path: byteAt(start), Hint: "the message was truncated or corrupted in transit"}
			}
			pos = vs + int(length)
			out = append(out, Record{f, wt, start, vs, pos})
		case WireVarint:
			_, p, err := ReadVarint(buf, pos)
			if err != nil {
				return nil, err
			}
			pos = p
			out = append(out, Record{f, wt, start, start, pos})
		case WireI64, WireI32:
			n := 8
			if wt == WireI32 {
				n = 4
			}
			if end-pos < n {
				return nil, prismerr.Newf("truncated", "fixed-width field %d runs past the end", f).At(byteAt(start))
			}
			pos += n
			out = append(out, Record{f, wt, start, start, pos})
		default:
			return nil, prismerr.Newf("wire_type",
				"wire type %d (group or invalid) for field %d is not supported at the envelope's top level", wt, f).At(byteAt(start))
		}
	}
	return out, nil
}

func u64toa(v uint64) string { return strconv.FormatUint(v, 10) }

// VarintValue reads the value of a varint record found by Scan.
func VarintValue(buf []byte, r Record) uint64 {
	_, p, _ := ReadVarint(buf, r.Start)
	v, _, _ := ReadVarint(buf, p)
	return v
}
