package envelope

import (
	"errors"

	"github.com/prism-envelope/prism/clients/go/gen/draftpb"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Layout is one of RFC-031's two wire layouts.
type Layout int

const (
	// Auto lets Decode detect the layout from the bytes.
	Auto Layout = iota
	// Draft is the RFC-031 draft layout (envelope_version = 1, payload field 3), <topic>.v2.
	Draft
	// Reviewed is the memo-031 reviewed layout (payload field 99), <topic>.v3.
	Reviewed
)

func (l Layout) String() string {
	switch l {
	case Draft:
		return "draft"
	case Reviewed:
		return "reviewed"
	}
	return "auto"
}

// SecurityField is the top-level field number of the security context (4 draft, 2 reviewed).
func (l Layout) SecurityField() int {
	if l == Draft {
		return 4
	}
	return 2
}

// PayloadField is the top-level field number of the payload (3 draft, 99 reviewed).
func (l Layout) PayloadField() int {
	if l == Draft {
		return 3
	}
	return 99
}

// Limits are size limits, checked before any payload byte is touched (the Python SDK's
// defaults: a 16 MiB message, a 256 KiB header).
type Limits struct {
	MaxMessageBytes int
	MaxHeaderBytes  int
}

// DefaultLimits are the limits Decode applies unless told otherwise.
var DefaultLimits = Limits{MaxMessageBytes: 16 * 1024 * 1024, MaxHeaderBytes: 256 * 1024}

// unmarshal parses header bytes. Go's protobuf runtime bounds nesting (10,000 levels) and
// checks UTF-8 in proto3 strings, as upb does for Python.
var unmarshal = proto.UnmarshalOptions{RecursionLimit: 100}

// DetectLayout tells the draft layout from the reviewed one by field 1's wire type
// (draft: envelope_version, a varint; reviewed: metadata, length-delimited). Without field
// 1, fields 5 or 6 mean draft; otherwise reviewed.
func DetectLayout(data []byte) (Layout, error) {
	recs, err := Scan(data)
	if err != nil {
		return Auto, err
	}
	return LayoutOfRecords(recs)
}

// LayoutOfRecords is DetectLayout for records already scanned.
func LayoutOfRecords(recs []Record) (Layout, error) {
	for _, r := range recs {
		if r.Field == 1 {
			if r.WireType == WireVarint {
				return Draft, nil
			}
			return Reviewed, nil
		}
	}
	for _, r := range recs {
		if r.Field == 5 || r.Field == 6 {
			return Draft, nil
		}
	}
	if len(recs) == 0 {
		return Auto, prismerr.New("unknown_layout", "empty input is not an envelope", "check the producer sends envelope bytes")
	}
	return Reviewed, nil
}

// DecodeOptions tune Decode; the zero value detects the layout and applies DefaultLimits.
type DecodeOptions struct {
	Layout Layout  // Auto (detect), Draft or Reviewed (e.g. known from the topic)
	Limits *Limits // nil: DefaultLimits
}

// Decode decodes envelope bytes of either layout into the model. It is always a
// header-only parse: the payload record is skipped by its length prefix and kept as a
// sub-slice of data (zero-copy, not read until asked for), so its cost does not depend on
// the payload's size. data must not be modified while the envelope is in use.
func Decode(data []byte) (*Envelope, error) {
	env, _, err := DecodeWith(data, DecodeOptions{})
	return env, err
}

// DecodeWith is Decode with options; it also returns what a draft -> model conversion
// could not carry (sub-millisecond timestamps, a newer envelope_version).
func DecodeWith(data []byte, opts DecodeOptions) (*Envelope, []string, error) {
	limits := DefaultLimits
	if opts.Limits != nil {
		limits = *opts.Limits
	}
	if len(data) > limits.MaxMessageBytes {
		return nil, nil, prismerr.Newf("too_large", "envelope is %d bytes, over the %d-byte limit", len(data), limits.MaxMessageBytes).
			WithHint("raise Limits.MaxMessageBytes or have the producer split the message")
	}
	recs, err := ScanEnvelope(data, opts.Layout, limits.MaxHeaderBytes)
	if err != nil {
		return nil, nil, err
	}
	lay := opts.Layout
	if lay == Auto {
		if lay, err = LayoutOfRecords(recs); err != nil {
			return nil, nil, err
		}
	}
	return DecodeRecords(data, recs, lay, limits)
}

// DecodeRecords is Decode for callers that already scanned the records.
func DecodeRecords(data []byte, recs []Record, lay Layout, limits Limits) (*Envelope, []string, error) {
	pf := lay.PayloadField()
	headerLen := 0
	var payloads []Record
	contiguous := true // header records are one run before a last payload record
	for i, r := range recs {
		if r.Field == pf {
			if r.WireType != WireLen {
				return nil, nil, prismerr.Newf("wire_type", "payload field %d must be length-delimited, got wire type %d", pf, r.WireType).At(byteAt(r.Start))
			}
			payloads = append(payloads, r)
			if i != len(recs)-1 {
				contiguous = false
			}
			continue
		}
		headerLen += r.End - r.Start
	}
	if headerLen > limits.MaxHeaderBytes {
		return nil, nil, prismerr.Newf("too_large", "envelope header is %d bytes, over the %d-byte limit", headerLen, limits.MaxHeaderBytes).
			WithHint("move bulky data into the payload, or raise Limits.MaxHeaderBytes")
	}
	var head []byte
	if contiguous && len(payloads) <= 1 {
		head = data[:headerLen] // the fast path: what every Prism encoder writes
	} else {
		head = make([]byte, 0, headerLen)
		for _, r := range recs {
			if r.Field != pf {
				head = append(head, data[r.Start:r.End]...)
			}
		}
	}
	header, dropped, err := parseHeader(head, lay)
	if err != nil {
		return nil, nil, err
	}
	var payload *Payload
	switch len(payloads) {
	case 0:
		payload = AbsentPayload()
	case 1:
		r := payloads[0]
		payload = PayloadFromWire(data[r.ValueStart:r.End:r.End])
	default: // protobuf merge semantics for a repeated singular message field
		var merged []byte
		for _, r := range payloads {
			merged = append(merged, data[r.ValueStart:r.End]...)
		}
		payload = PayloadFromWire(merged)
	}
	return &Envelope{Header: header, Payload: payload}, dropped, nil
}

func parseHeader(head []byte, lay Layout) (*reviewedpb.PrismEnvelope, []string, error) {
	bad := func(err error) error {
		return (&prismerr.Error{Code: "malformed_envelope", What: "envelope header (" + lay.String() + " layout) is not valid protobuf: " + err.Error(),
			Hint: "a string field may hold invalid UTF-8, or a nested message is truncated or has a wrong wire type"}).Wrap(err)
	}
	if lay == Reviewed {
		h := &reviewedpb.PrismEnvelope{}
		if err := unmarshal.Unmarshal(head, h); err != nil {
			return nil, nil, bad(err)
		}
		if err := unknownDepth(h.ProtoReflect(), 0); err != nil {
			return nil, nil, bad(err)
		}
		upbMapEntries(h.ProtoReflect(), head, 0)
		h.Payload = nil
		return h, nil, nil
	}
	d := &draftpb.PrismEnvelope{}
	if err := unmarshal.Unmarshal(head, d); err != nil {
		return nil, nil, bad(err)
	}
	if err := unknownDepth(d.ProtoReflect(), 0); err != nil {
		return nil, nil, bad(err)
	}
	upbMapEntries(d.ProtoReflect(), head, 0)
	d.Payload = nil
	return DraftToReviewed(d)
}

var marshal = proto.MarshalOptions{Deterministic: true}

// LayoutHeader returns the header message in a layout (the model itself for Reviewed).
func LayoutHeader(env *Envelope, lay Layout) (proto.Message, error) {
	if lay == Draft {
		d, _, err := ReviewedToDraft(env.Header)
		return d, err
	}
	return env.Header, nil
}

// EncodeParts serializes the envelope as (header without security, security record,
// payload record): the runs the signing package cuts its signed bytes from.
func EncodeParts(env *Envelope, lay Layout) (head, sec, payload []byte, err error) {
	if lay == Auto {
		lay = Reviewed
	}
	h, err := LayoutHeader(env, lay)
	if err != nil {
		return nil, nil, nil, err
	}
	head, sec, err = SplitHeader(h, lay)
	if err != nil {
		return nil, nil, nil, err
	}
	return head, sec, PayloadRecord(env, lay), nil
}

// Encode serializes the envelope in a layout as [header without security][security][payload]:
// the payload last (a streaming reader can stop before it), and the security record one run.
func Encode(env *Envelope, lay Layout) ([]byte, error) {
	head, sec, payload, err := EncodeParts(env, lay)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(head)+len(sec)+len(payload))
	return append(append(append(out, head...), sec...), payload...), nil
}

// Convert re-encodes envelope bytes in another layout and returns what was dropped. A
// signature never survives a layout change (it covers the old bytes), so it is removed and
// reported; re-sign after converting.
func Convert(data []byte, to Layout) ([]byte, []string, error) {
	env, dropped, err := DecodeWith(data, DecodeOptions{})
	if err != nil {
		return nil, nil, err
	}
	if to == Draft {
		_, lost, err := ReviewedToDraft(env.Header)
		if err != nil {
			return nil, nil, err
		}
		dropped = append(dropped, lost...)
	}
	if sec := env.Header.Security; sec != nil && sec.Signature != nil {
		sec.Signature, sec.SignatureAlgorithm, sec.SignatureKeyId, sec.SignatureScope = nil, nil, nil, nil
		sec.SiblingDigest, sec.TreeIndex, sec.TreeSize, sec.TreePath = nil, nil, nil, nil
		dropped = append(dropped, "security.signature: covers the original bytes only; re-sign after conversion")
	}
	out, err := Encode(env, to)
	return out, dropped, err
}

// Location says where the payload sits in envelope bytes, found without parsing it:
// the whole top-level record, its value (the serialized Any) and Any.value inside it.
type Location struct {
	RecordOffset, RecordLength int
	AnyOffset, AnyLength       int
	ValueOffset, ValueLength   int // ValueOffset is -1 when the Any has no value
}

// FindPayload locates the (last) payload record of envelope bytes in a layout; ok is false
// when there is none.
func FindPayload(data []byte, lay Layout) (loc Location, ok bool, err error) {
	recs, err := Scan(data)
	if err != nil {
		return loc, false, err
	}
	if lay == Auto {
		if lay, err = LayoutOfRecords(recs); err != nil {
			return loc, false, err
		}
	}
	for _, r := range recs {
		if r.Field == lay.PayloadField() && r.WireType == WireLen {
			loc = Location{RecordOffset: r.Start, RecordLength: r.End - r.Start, AnyOffset: r.ValueStart, AnyLength: r.End - r.ValueStart, ValueOffset: -1}
			ok = true
		}
	}
	if !ok {
		return loc, false, nil
	}
	inner, err := Scan(data[loc.AnyOffset : loc.AnyOffset+loc.AnyLength])
	if err != nil {
		return loc, true, nil // not a valid Any: located all the same, only reading it fails
	}
	for _, r := range inner {
		if r.Field == 2 && r.WireType == WireLen {
			loc.ValueOffset, loc.ValueLength = loc.AnyOffset+r.ValueStart, r.End-r.ValueStart
		}
	}
	return loc, true, nil
}

// SplitHeader serializes a layout header (a *reviewedpb.PrismEnvelope or a
// *draftpb.PrismEnvelope, as LayoutHeader returns) as (header without security, security
// record). The signing package signs and re-assembles these runs.
func SplitHeader(h proto.Message, lay Layout) (head, sec []byte, err error) {
	full, err := marshal.Marshal(h)
	if err != nil {
		return nil, nil, (&prismerr.Error{Code: "invalid_envelope", What: "header cannot be serialized: " + err.Error(),
			Hint: "string fields must be valid UTF-8"}).Wrap(err)
	}
	recs, err := Scan(full)
	if err != nil {
		return nil, nil, err
	}
	sf := lay.SecurityField()
	head = make([]byte, 0, len(full))
	for _, r := range recs {
		if r.Field == sf {
			sec = append(sec, full[r.Start:r.End]...)
		} else {
			head = append(head, full[r.Start:r.End]...)
		}
	}
	return head, sec, nil
}

// PayloadRecord is the envelope's payload record in a layout (nil when it has none).
func PayloadRecord(env *Envelope, lay Layout) []byte {
	if !env.Payload.Present() {
		return nil
	}
	w := env.Payload.Wire()
	out := AppendVarint(make([]byte, 0, len(w)+6), uint64(lay.PayloadField()<<3|WireLen))
	out = AppendVarint(out, uint64(len(w)))
	return append(out, w...)
}

// SecurityRecord serializes a security context (either layout's message) as its top-level
// record: tag, length, value.
func SecurityRecord(sec proto.Message, lay Layout) ([]byte, error) {
	body, err := marshal.Marshal(sec)
	if err != nil {
		return nil, (&prismerr.Error{Code: "invalid_envelope", What: "security context cannot be serialized: " + err.Error(),
			Path: "security"}).Wrap(err)
	}
	out := AppendVarint(nil, uint64(lay.SecurityField()<<3|WireLen))
	out = AppendVarint(out, uint64(len(body)))
	return append(out, body...), nil
}

// unknownDepth applies the recursion limit to groups kept as unknown fields, as upb (Python)
// does: Go's runtime skips an unknown group with its own limit of 10,000 levels, whatever
// UnmarshalOptions.RecursionLimit says, so a header Python refuses (a group nested 100 deep in
// metadata) decoded in Go. depth is m's nesting below the envelope; a message's depth plus the
// groups nested in its unknown fields may not exceed the limit.
func unknownDepth(m protoreflect.Message, depth int) error {
	if g := groupDepth(m.GetUnknown()); depth+g > unmarshal.RecursionLimit {
		return errors.New("groups in unknown fields nest deeper than the recursion limit (" + itoa(unmarshal.RecursionLimit) + ")")
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					err = unknownDepth(mv.Message(), depth+2) // the entry, then its value
					return err == nil
				})
			}
		case fd.Message() != nil && fd.IsList():
			for i, l := 0, v.List(); i < l.Len() && err == nil; i++ {
				err = unknownDepth(l.Get(i).Message(), depth+1)
			}
		case fd.Message() != nil:
			err = unknownDepth(v.Message(), depth+1)
		}
		return err == nil
	})
	return err
}

// groupDepth is the deepest group nesting in raw (unknown fields, already validated by the
// runtime's parse).
func groupDepth(raw []byte) int {
	depth, max := 0, 0
	for len(raw) > 0 {
		_, typ, n := protowire.ConsumeTag(raw)
		if n < 0 {
			return max
		}
		raw = raw[n:]
		switch typ {
		case protowire.StartGroupType:
			depth++
			if depth > max {
				max = depth
			}
			continue
		case protowire.EndGroupType:
			depth--
			continue
		}
		m := protowire.ConsumeFieldValue(0, typ, raw)
		if m < 0 {
			return max
		}
		raw = raw[m:]
	}
	return max
}
