package envelope

import (
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Map entries with unknown fields, read as Python reads them.
//
// A map entry is a small message {1: key, 2: value}. When an entry holds anything else (a
// third field, or a key or value of another wire type), upb - the parser under Python's
// protobuf, hence under Prism's worker and Python SDK - does not put it in the map: it keeps
// the whole entry, bytes as received, among the enclosing message's unknown fields. Go's
// protobuf runtime instead drops the entry's unknown fields and stores key and value. The two
// would then disagree on what an envelope says - an `extensions` key, a trace `labels` or
// `baggage` entry - that the other side does not see (found by the differential test against
// Python, tests/clients/test_go.py). upbMapEntries brings a message parsed by Go to upb's
// reading: it rebuilds every map field from the received entries, and moves an entry that
// upb would not accept into the unknown fields, in its place among the other unknown fields,
// written as upb writes it (upbEntry).
// It does nothing (and costs one scan) when no entry is odd, the normal case.

// plan is what upbMapEntries looks at in one message type: its map fields, and its singular
// message fields whose type (at any depth) holds a map. Built once per type.
type plan struct {
	maps   []protoreflect.FieldNumber // few (one or two): a slice beats a map here
	nested []protoreflect.FieldDescriptor
}

func (p *plan) isMap(n protoreflect.FieldNumber) bool {
	for _, m := range p.maps {
		if m == n {
			return true
		}
	}
	return false
}

func (p *plan) nestedField(n protoreflect.FieldNumber) protoreflect.FieldDescriptor {
	for _, fd := range p.nested {
		if fd.Number() == n {
			return fd
		}
	}
	return nil
}

var plans sync.Map // protoreflect.MessageDescriptor -> *plan (nil: nothing to look at)

func planOf(md protoreflect.MessageDescriptor, depth int) *plan {
	if v, ok := plans.Load(md); ok {
		return v.(*plan)
	}
	p := &plan{}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		switch {
		case fd.IsMap():
			p.maps = append(p.maps, fd.Number())
		case fd.Message() != nil && !fd.IsList() && depth < 32 && fd.Message() != md && planOf(fd.Message(), depth+1) != nil:
			p.nested = append(p.nested, fd)
		}
	}
	if len(p.maps) == 0 && len(p.nested) == 0 {
		p = nil
	}
	plans.Store(md, p)
	return p
}

// upbMapEntries fixes m, just parsed from raw, and the messages nested in it. The check is
// one pass over the records that allocates nothing; only an odd entry costs more.
func upbMapEntries(m protoreflect.Message, raw []byte, depth int) {
	p := planOf(m.Descriptor(), 0)
	if depth > 100 || p == nil {
		return
	}
	odd := false
	var nestedFD []protoreflect.FieldDescriptor
	var nestedRaw [][]byte
	for b := raw; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		l := protowire.ConsumeFieldValue(num, typ, b[n:])
		if l < 0 {
			return
		}
		if typ == protowire.BytesType {
			if p.isMap(num) {
				if val, _ := protowire.ConsumeBytes(b[n : n+l]); !plainEntryOK(val) {
					odd = true
				}
			} else if fd := p.nestedField(num); fd != nil {
				// a singular message field written several times is the merge of its records
				val, _ := protowire.ConsumeBytes(b[n : n+l])
				i := 0
				for i < len(nestedFD) && nestedFD[i] != fd {
					i++
				}
				if i == len(nestedFD) {
					nestedFD, nestedRaw = append(nestedFD, fd), append(nestedRaw, val)
				} else {
					nestedRaw[i] = append(append([]byte(nil), nestedRaw[i]...), val...)
				}
			}
		}
		b = b[n+l:]
	}
	for i, fd := range nestedFD {
		if m.Has(fd) {
			upbMapEntries(m.Mutable(fd).Message(), nestedRaw[i], depth+1)
		}
	}
	if !odd {
		return
	}
	fields := m.Descriptor().Fields()
	recs, err := Scan(raw)
	if err != nil {
		return
	}
	// Rebuild: maps from the plain entries in order (the last of a key wins, as on any
	// parse), unknown fields from the records Go kept as unknown plus the odd entries, in
	// their order on the wire.
	cleared := map[protoreflect.FieldNumber]bool{}
	var unknown []byte
	for _, r := range recs {
		fd := fields.ByNumber(protoreflect.FieldNumber(r.Field))
		rec := raw[r.Start:r.End]
		if fd == nil || !wireTypeFits(fd, r.WireType) {
			unknown = append(unknown, rec...)
			continue
		}
		if !fd.IsMap() {
			continue
		}
		if !cleared[fd.Number()] {
			m.Clear(fd)
			cleared[fd.Number()] = true
		}
		k, v, ok := plainEntry(raw[r.ValueStart:r.End])
		if !ok {
			unknown = protowire.AppendTag(unknown, fd.Number(), protowire.BytesType)
			unknown = protowire.AppendBytes(unknown, upbEntry(raw[r.ValueStart:r.End]))
			continue
		}
		mp := m.Mutable(fd).Map()
		var value protoreflect.Value
		if fd.MapValue().Kind() == protoreflect.BytesKind {
			value = protoreflect.ValueOfBytes(append([]byte{}, v...))
		} else {
			value = protoreflect.ValueOfString(string(v))
		}
		mp.Set(protoreflect.ValueOfString(string(k)).MapKey(), value)
	}
	m.SetUnknown(unknown)
}

// upbEntry is an odd entry as upb keeps it: parsed as the entry message and written again -
// its key and value (the last of each, omitted when empty: implicit presence), then its
// unknown records in their order.
func upbEntry(b []byte) []byte {
	recs, err := Scan(b)
	if err != nil {
		return b
	}
	var key, value, unknown []byte
	for _, r := range recs {
		switch {
		case r.WireType == WireLen && r.Field == 1:
			key = b[r.ValueStart:r.End]
		case r.WireType == WireLen && r.Field == 2:
			value = b[r.ValueStart:r.End]
		default:
			unknown = append(unknown, b[r.Start:r.End]...)
		}
	}
	var out []byte
	if len(key) > 0 {
		out = protowire.AppendBytes(protowire.AppendTag(out, 1, protowire.BytesType), key)
	}
	if len(value) > 0 {
		out = protowire.AppendBytes(protowire.AppendTag(out, 2, protowire.BytesType), value)
	}
	return append(out, unknown...)
}

// plainEntryOK is plainEntry's verdict without allocating.
func plainEntryOK(b []byte) bool {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType || (num != 1 && num != 2) {
			return false
		}
		l := protowire.ConsumeFieldValue(num, typ, b[n:])
		if l < 0 {
			return false
		}
		b = b[n+l:]
	}
	return true
}

// plainEntry reads a map<string, string|bytes> entry that upb accepts: only fields 1 and 2,
// both length-delimited. Missing ones are empty.
func plainEntry(b []byte) (key, value []byte, ok bool) {
	recs, err := Scan(b)
	if err != nil {
		return nil, nil, false
	}
	for _, r := range recs {
		if r.WireType != WireLen || (r.Field != 1 && r.Field != 2) {
			return nil, nil, false
		}
		if r.Field == 1 {
			key = b[r.ValueStart:r.End]
		} else {
			value = b[r.ValueStart:r.End]
		}
	}
	return key, value, true
}

// wireTypeFits reports whether Go's runtime parses a record of this wire type as field fd
// (otherwise it keeps the record among the unknown fields).
func wireTypeFits(fd protoreflect.FieldDescriptor, wt int) bool {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind, protoreflect.StringKind, protoreflect.BytesKind:
		return wt == WireLen
	}
	if fd.IsList() && wt == WireLen { // packed
		return true
	}
	switch fd.Kind() {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return wt == 5
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return wt == 1
	}
	return wt == WireVarint
}

// UnknownRecords returns m's unknown fields as Python's unknown_records reads them
// (app/envelope/layouts.py): the records of numbers m does not know, and of known numbers
// written with a wire type they are not read with. An odd map entry kept among the unknown
// fields (see upbMapEntries) is neither, so - as in Python - it is re-encoded with the
// message but not reported, nor carried across a layout conversion.
func UnknownRecords(m protoreflect.Message) []byte {
	raw := m.GetUnknown()
	if len(raw) == 0 {
		return nil
	}
	recs, err := Scan(raw)
	if err != nil {
		return raw
	}
	fields := m.Descriptor().Fields()
	var out []byte
	for _, r := range recs {
		if fd := fields.ByNumber(protoreflect.FieldNumber(r.Field)); fd == nil || !wireTypeFits(fd, r.WireType) {
			out = append(out, raw[r.Start:r.End]...)
		}
	}
	return out
}
