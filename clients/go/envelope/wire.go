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
	return scan(buf, nil)
}

// ScanEnvelope is Scan for the top level of an envelope whose header (every record but the
// payload) may take at most maxHeader bytes, checked while it walks: a record is ~40 bytes of
// memory, so 16 MiB of two-byte records would otherwise become ~5.6M records (over 1 GB
// allocated) before DecodeRecords refuses the header. lay may be Auto: the walk stops once the
// header is over the limit in both layouts. A repeated payload record's tag and length count
// as header (Prism's encoders write one payload record; protobuf would merge the copies), so
// a flood of empty payload records is bounded too.
func ScanEnvelope(buf []byte, lay Layout, maxHeader int) ([]Record, error) {
	return scan(buf, &headerBudget{lay: lay, max: maxHeader})
}

type headerBudget struct {
	lay     Layout
	max     int
	bytes   [3]int  // by Layout: header bytes so far were the envelope of that layout
	payload [3]bool // by Layout: a payload record was seen
}

// add counts r and reports whether the header is over the limit in every layout it may be.
func (b *headerBudget) add(r Record) bool {
	over := true
	for _, lay := range [...]Layout{Draft, Reviewed} {
		if b.lay != Auto && b.lay != lay {
			continue
		}
		switch {
		case r.Field != lay.PayloadField() || r.WireType != WireLen:
			b.bytes[lay] += r.End - r.Start
		case b.payload[lay]:
			b.bytes[lay] += r.ValueStart - r.Start
		default:
			b.payload[lay] = true
		}
		over = over && b.bytes[lay] > b.max
	}
	return over
}

func (b *headerBudget) err(at int) error {
	n := b.bytes[Draft]
	if b.lay == Reviewed || b.lay == Auto && b.bytes[Reviewed] < n {
		n = b.bytes[Reviewed]
	}
	return prismerr.Newf("too_large", "envelope header is over the %d-byte limit (%d bytes by byte %d)", b.max, n, at).
		WithHint("move bulky data into the payload, or raise Limits.MaxHeaderBytes")
}

func scan(buf []byte, budget *headerBudget) ([]Record, error) {
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
		if budget != nil && budget.add(out[len(out)-1]) {
			return nil, budget.err(pos)
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
