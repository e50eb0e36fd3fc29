// Package envelope encodes and decodes Prism envelopes in both wire layouts of RFC-031
// (draft, what <topic>.v2 carries; reviewed, what <topic>.v3 carries), converts between
// them without loss, and reads the header without touching the payload.
//
// The model is the reviewed layout's generated message (gen/reviewedpb) with its payload
// field left empty, plus a lazy Payload that keeps the received bytes of the payload's
// google.protobuf.Any until somebody asks for them: decoding a 1 MB envelope costs what
// decoding its header costs (BENCHMARKS.md, "Go client").
//
// Every function that reads untrusted bytes returns a *prismerr.Error and never panics.
package envelope

import (
	"encoding/json"
	"math"
	"math/big"
	"time"
	"unicode/utf8"

	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/internal/untrustedjson"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
)

// DefaultPriority is the priority of an envelope that states none (memo-031).
const DefaultPriority = 5

// ProtobufTypeURLPrefix prefixes the type_url of a protobuf payload, as Any.Pack does.
const ProtobufTypeURLPrefix = "type.googleapis.com/"

var ctToMime = map[reviewedpb.ContentType]string{
	reviewedpb.ContentType_CONTENT_TYPE_PROTOBUF: "application/protobuf",
	reviewedpb.ContentType_CONTENT_TYPE_JSON:     "application/json",
	reviewedpb.ContentType_CONTENT_TYPE_AVRO:     "application/avro",
}
var mimeToCt = invert(ctToMime)

var ceToName = map[reviewedpb.ContentEncoding]string{
	reviewedpb.ContentEncoding_CONTENT_ENCODING_NONE:   "none",
	reviewedpb.ContentEncoding_CONTENT_ENCODING_GZIP:   "gzip",
	reviewedpb.ContentEncoding_CONTENT_ENCODING_SNAPPY: "snappy",
	reviewedpb.ContentEncoding_CONTENT_ENCODING_ZSTD:   "zstd",
}
var nameToCe = invert(ceToName)

func invert[K comparable, V comparable](m map[K]V) map[V]K {
	out := make(map[V]K, len(m))
	for k, v := range m {
		out[v] = k
	}
	return out
}

// ContentType returns the metadata's content type as a MIME string ("" when unset).
func ContentType(md *reviewedpb.PrismMetadata) string {
	if md == nil || md.ContentType == nil {
		return ""
	}
	if *md.ContentType == reviewedpb.ContentType_CONTENT_TYPE_CUSTOM {
		return md.GetContentTypeCustom()
	}
	return ctToMime[*md.ContentType]
}

// SetContentType stores a MIME string, using the compact enum only for the exact canonical
// spellings so that any string round-trips unchanged through both layouts.
func SetContentType(md *reviewedpb.PrismMetadata, mime string) {
	md.ContentTypeCustom = nil
	switch ct, ok := mimeToCt[mime]; {
	case mime == "":
		md.ContentType = nil
	case ok:
		md.ContentType = &ct
	default:
		md.ContentType = reviewedpb.ContentType_CONTENT_TYPE_CUSTOM.Enum()
		md.ContentTypeCustom = proto.String(mime)
	}
}

// ContentEncoding returns the content encoding's name ("" when unset, "none", "gzip", ...).
func ContentEncoding(md *reviewedpb.PrismMetadata) string {
	if md == nil || md.ContentEncoding == nil {
		return ""
	}
	if *md.ContentEncoding == reviewedpb.ContentEncoding_CONTENT_ENCODING_CUSTOM {
		return md.GetContentEncodingCustom()
	}
	return ceToName[*md.ContentEncoding]
}

// SetContentEncoding stores an encoding name (enum for the known ones, custom otherwise).
func SetContentEncoding(md *reviewedpb.PrismMetadata, name string) {
	md.ContentEncodingCustom = nil
	switch ce, ok := nameToCe[name]; {
	case name == "":
		md.ContentEncoding = nil
	case ok:
		md.ContentEncoding = &ce
	default:
		md.ContentEncoding = reviewedpb.ContentEncoding_CONTENT_ENCODING_CUSTOM.Enum()
		md.ContentEncodingCustom = proto.String(name)
	}
}

// Payload is the payload's google.protobuf.Any, kept as its received wire bytes until
// TypeURL or Value is called (a header-only parse never reads it). Value is a sub-slice of
// the decoded buffer: nothing is copied.
type Payload struct {
	raw     []byte // the serialized Any, when known
	typeURL string
	value   []byte
	parsed  bool
	present bool
}

// NewPayload wraps a type URL and a value (already compressed/encrypted as the metadata says).
func NewPayload(typeURL string, value []byte) *Payload {
	return &Payload{typeURL: typeURL, value: value, parsed: true, present: true}
}

// PayloadFromWire wraps the serialized Any bytes without parsing them.
func PayloadFromWire(raw []byte) *Payload { return &Payload{raw: raw, present: true} }

// AbsentPayload is the payload of an envelope that carried no payload record.
func AbsentPayload() *Payload { return &Payload{parsed: true} }

// Present is false when the envelope had no payload record at all (a validation error).
func (p *Payload) Present() bool { return p != nil && p.present }

// IsParsed is false while the payload is still an unread slice of the input.
func (p *Payload) IsParsed() bool { return p.parsed }

func (p *Payload) parse() error {
	if p.parsed {
		return nil
	}
	recs, err := Scan(p.raw)
	if err != nil {
		e := err.(*prismerr.Error)
		return e.At("payload " + e.Path)
	}
	typeURL, value := "", p.raw[:0]
	for _, r := range recs {
		if r.WireType != WireLen {
			continue // unknown scalar inside Any: ignored, as protobuf would
		}
		switch r.Field {
		case 1:
			if !utf8.Valid(p.raw[r.ValueStart:r.End]) {
				return prismerr.New("bad_utf8", "payload type_url is not valid UTF-8", "").At("payload.type_url")
			}
			typeURL = string(p.raw[r.ValueStart:r.End])
		case 2:
			value = p.raw[r.ValueStart:r.End:r.End]
		}
	}
	p.typeURL, p.value, p.parsed = typeURL, value, true
	return nil
}

// TypeURL is the payload's type URL ("" for non-protobuf payloads).
func (p *Payload) TypeURL() (string, error) {
	if err := p.parse(); err != nil {
		return "", err
	}
	return p.typeURL, nil
}

// Value is the payload value exactly as on the wire (possibly compressed and/or encrypted).
func (p *Payload) Value() ([]byte, error) {
	if err := p.parse(); err != nil {
		return nil, err
	}
	return p.value, nil
}

// Wire is the serialized Any: the received bytes when the payload was decoded.
func (p *Payload) Wire() []byte {
	if p.raw != nil || !p.present {
		return p.raw
	}
	var b []byte
	if p.typeURL != "" {
		b = append(b, 0x0a)
		b = AppendVarint(b, uint64(len(p.typeURL)))
		b = append(b, p.typeURL...)
	}
	if len(p.value) > 0 {
		b = append(b, 0x12)
		b = AppendVarint(b, uint64(len(p.value)))
		b = append(b, p.value...)
	}
	if b == nil {
		b = []byte{}
	}
	p.raw = b
	return b
}

// Envelope is a decoded envelope: Header is the reviewed-layout message with its payload
// field empty (metadata, security, observability, schema, extensions, unknown fields),
// Payload the lazy payload.
type Envelope struct {
	Header  *reviewedpb.PrismEnvelope
	Payload *Payload
}

// Metadata returns the header's metadata (never nil: an empty one is created).
func (e *Envelope) Metadata() *reviewedpb.PrismMetadata {
	if e.Header.Metadata == nil {
		e.Header.Metadata = &reviewedpb.PrismMetadata{}
	}
	return e.Header.Metadata
}

// Security returns the security context, or nil.
func (e *Envelope) Security() *reviewedpb.SecurityContext { return e.Header.GetSecurity() }

// EnsureSecurity returns the security context, creating it when absent.
func (e *Envelope) EnsureSecurity() *reviewedpb.SecurityContext {
	if e.Header.Security == nil {
		e.Header.Security = &reviewedpb.SecurityContext{}
	}
	return e.Header.Security
}

// IsEncrypted reports whether the security context carries encryption metadata.
func (e *Envelope) IsEncrypted() bool { return e.Header.GetSecurity().GetEncryption() != nil }

// Priority is the metadata's priority, or DefaultPriority when it states none.
func (e *Envelope) Priority() int32 {
	if p := e.Header.GetMetadata().Priority; p != nil {
		return *p
	}
	return DefaultPriority
}

// ExpiresAt is the expiry time, or the zero time when the envelope does not expire. An
// expiry past the int64 millisecond range (a TTL of math.MaxInt64, which the builders and
// Python's options accept) is clamped to the range's end: still after any clock's now.
func (e *Envelope) ExpiresAt() time.Time {
	ms, ok := e.expiryMs()
	if !ok {
		return time.Time{}
	}
	if !ms.IsInt64() {
		return time.UnixMilli(math.MaxInt64)
	}
	return time.UnixMilli(ms.Int64())
}

// IsExpired reports whether now is at or past the expiry, Python's Envelope.is_expired:
// published_at_ms + ttl_seconds * 1000 computed without overflow (int64 arithmetic would wrap
// a large TTL around to a time in the past and drop a message that never expires). An expiry
// past the int64 range is after every now, math.MaxInt64 ms included - not clamped to it
// (conformance/expiry/, "expiry-past-int64-max").
func (e *Envelope) IsExpired(now time.Time) bool {
	ms, ok := e.expiryMs()
	return ok && ms.IsInt64() && now.UnixMilli() >= ms.Int64()
}

// expiryMs is published_at_ms + ttl_seconds * 1000, exact (it may exceed int64; ttl > 0, so it
// is never below published_at_ms >= math.MinInt64); false when ttl_seconds <= 0.
func (e *Envelope) expiryMs() (*big.Int, bool) {
	md := e.Header.GetMetadata()
	ttl := md.GetTtlSeconds()
	if ttl <= 0 {
		return nil, false
	}
	x := new(big.Int).Mul(big.NewInt(ttl), big.NewInt(1000))
	return x.Add(x, big.NewInt(md.GetPublishedAtMs())), true
}

// ExpiresAtMs is the exact expiry in Unix milliseconds (published_at_ms + ttl_seconds * 1000,
// possibly beyond int64), or nil when the envelope does not expire.
func (e *Envelope) ExpiresAtMs() *big.Int {
	ms, ok := e.expiryMs()
	if !ok {
		return nil
	}
	return ms
}

// PayloadBytes is the plaintext payload, decompressed per content_encoding (at most
// DefaultMaxDecompressed bytes). An encrypted payload is an error: decrypt it first with
// the encryption package; decryption is never an implicit side effect.
func (e *Envelope) PayloadBytes() ([]byte, error) {
	if e.IsEncrypted() {
		return nil, prismerr.New("payload_error", "payload is encrypted",
			"decrypt it with encryption.DecryptEnvelope(env, keys)").At("security.encryption")
	}
	v, err := e.Payload.Value()
	if err != nil {
		return nil, err
	}
	return Decompress(v, ContentEncoding(e.Header.GetMetadata()), DefaultMaxDecompressed)
}

// PayloadJSON unmarshals a JSON payload into out.
func (e *Envelope) PayloadJSON(out any) error {
	b, err := e.PayloadBytes()
	if err != nil {
		return err
	}
	// the bounded checks Python's and Rust's payload_json apply (app/untrusted_json.py)
	if what := untrustedjson.Check(b, untrustedjson.MaxDepth); what != "" {
		return prismerr.New("payload_error", "payload is not valid JSON: "+what,
			"content_type is "+quote(ContentType(e.Header.GetMetadata()))+"; read it with PayloadBytes instead").At("payload")
	}
	if err := json.Unmarshal(b, out); err != nil {
		return &prismerr.Error{Code: "payload_error", What: "payload is not valid JSON for the requested type: " + err.Error(),
			Path: "payload", Hint: "content_type is " + quote(ContentType(e.Header.GetMetadata())) + "; read it with PayloadBytes instead", Err: err}
	}
	return nil
}

// PayloadMessage unmarshals a protobuf payload into m, checking its type_url first.
func (e *Envelope) PayloadMessage(m proto.Message) error {
	want := ProtobufTypeURLPrefix + string(m.ProtoReflect().Descriptor().FullName())
	tu, err := e.Payload.TypeURL()
	if err != nil {
		return err
	}
	if tu != "" && tu != want {
		return prismerr.New("payload_error", "payload holds "+quote(tu)+", not "+quote(want),
			"pass the message type that matches the payload's type_url").At("payload.type_url")
	}
	b, err := e.PayloadBytes()
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(b, m); err != nil {
		return (&prismerr.Error{Code: "malformed_envelope", What: "payload is not a valid " + string(m.ProtoReflect().Descriptor().FullName()), Path: "payload"}).Wrap(err)
	}
	return nil
}

// Clone returns a deep copy of the header sharing the (immutable) payload.
func (e *Envelope) Clone() *Envelope {
	return &Envelope{Header: proto.Clone(e.Header).(*reviewedpb.PrismEnvelope), Payload: e.Payload}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }
