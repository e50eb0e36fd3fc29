// Package kafka publishes and subscribes Prism envelopes on Apache Kafka with franz-go,
// with the same record binding as the Python SDK (app/bindings/kafka.py, docs/bindings.md):
//
//   - value: the envelope bytes in one layout (draft for <topic>.v2, reviewed otherwise);
//   - headers: prism-envelope-version (draft only), prism-envelope-layout, prism-message-id,
//     prism-topic, prism-namespace, prism-trace-id and prism-content-type when set, and the
//     W3C traceparent/tracestate;
//   - key: the caller's, else the correlation id, else none;
//   - timestamp: published_at_ms.
//
// On receive every prism-* header copy is checked against the (verified) envelope, and a
// record whose copies disagree is refused, as in Python.
package kafka

import (
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Header names of the binding.
const (
	Prefix                = "prism-"
	HeaderEnvelopeVersion = "prism-envelope-version"
	HeaderEnvelopeLayout  = "prism-envelope-layout"
	HeaderMessageID       = "prism-message-id"
	HeaderTopic           = "prism-topic"
	HeaderNamespace       = "prism-namespace"
	HeaderTraceID         = "prism-trace-id"
	HeaderContentType     = "prism-content-type"
	HeaderTraceparent     = "traceparent"
	HeaderTracestate      = "tracestate"
	// DraftEnvelopeVersion is the prism-envelope-version value, sent with the draft layout only.
	DraftEnvelopeVersion = "1"
	tracestateExtension  = "w3c.tracestate"
)

// LayoutForTopic is the layout a migration topic carries: <topic>.v2 draft, <topic>.v3
// reviewed; ok is false for other topics.
func LayoutForTopic(topic string) (envelope.Layout, bool) {
	switch {
	case strings.HasSuffix(topic, ".v2"):
		return envelope.Draft, true
	case strings.HasSuffix(topic, ".v3"):
		return envelope.Reviewed, true
	}
	return envelope.Auto, false
}

// fieldValues are the duplicated metadata copies, in emission order.
func fieldValues(env *envelope.Envelope) [][2]string {
	md := env.Header.GetMetadata()
	return [][2]string{
		{HeaderMessageID, md.GetMessageId()},
		{HeaderTopic, md.GetTopic()},
		{HeaderNamespace, md.GetNamespace()},
		{HeaderTraceID, env.Header.GetObservability().GetTraceId()},
		{HeaderContentType, envelope.ContentType(md)},
	}
}

var hexLC = regexp.MustCompile(`^[0-9a-f]+$`)

// Traceparent is the W3C traceparent for the envelope's observability context, or "" when
// it has no usable trace (missing, invalid or all-zero ids).
func Traceparent(env *envelope.Envelope) string {
	obs := env.Header.GetObservability()
	if obs == nil {
		return ""
	}
	tid, sid, flags := obs.GetTraceId(), obs.GetSpanId(), obs.GetTraceFlags()
	if flags < 0 || flags > 0xff || len(tid) != 32 || len(sid) != 16 || !hexLC.MatchString(tid) || !hexLC.MatchString(sid) ||
		tid == strings.Repeat("0", 32) || sid == strings.Repeat("0", 16) {
		return ""
	}
	f := strconv.FormatInt(int64(flags&0x03), 16)
	if len(f) < 2 {
		f = "0" + f
	}
	return "00-" + tid + "-" + sid + "-" + f
}

var (
	tsKey   = regexp.MustCompile(`^(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})$`)
	tsValue = regexp.MustCompile(`^[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]$`)
)

// Tracestate is the W3C tracestate carried in the extension w3c.tracestate, or "" when it is
// absent or invalid (an invalid tracestate is dropped, as W3C Trace Context requires).
func Tracestate(env *envelope.Envelope) string {
	raw := string(env.Header.GetExtensions()[tracestateExtension])
	if raw == "" || len(raw) > 8192 {
		return ""
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range strings.Split(raw, ",") {
		m = strings.Trim(m, " \t")
		if m == "" {
			continue
		}
		k, v, ok := strings.Cut(m, "=")
		if !ok || !tsKey.MatchString(k) || !tsValue.MatchString(v) || seen[k] {
			return ""
		}
		seen[k] = true
		out = append(out, k+"="+v)
	}
	if len(out) == 0 || len(out) > 32 {
		return ""
	}
	return strings.Join(out, ",")
}

// Headers are the binding's own headers for env in a layout.
func Headers(env *envelope.Envelope, layout envelope.Layout) []kgo.RecordHeader {
	var h []kgo.RecordHeader
	if layout == envelope.Draft {
		h = append(h, kgo.RecordHeader{Key: HeaderEnvelopeVersion, Value: []byte(DraftEnvelopeVersion)})
	}
	h = append(h, kgo.RecordHeader{Key: HeaderEnvelopeLayout, Value: []byte(layout.String())})
	for _, f := range fieldValues(env) {
		if f[1] != "" {
			h = append(h, kgo.RecordHeader{Key: f[0], Value: []byte(f[1])})
		}
	}
	if tp := Traceparent(env); tp != "" {
		h = append(h, kgo.RecordHeader{Key: HeaderTraceparent, Value: []byte(tp)})
		if ts := Tracestate(env); ts != "" {
			h = append(h, kgo.RecordHeader{Key: HeaderTracestate, Value: []byte(ts)})
		}
	}
	return h
}

// PartitionKey is the record key: key when given, else the correlation id, else none.
func PartitionKey(env *envelope.Envelope, key []byte) []byte {
	if key != nil {
		return key
	}
	if c := env.Header.GetMetadata().GetCorrelationId(); c != "" {
		return []byte(c)
	}
	return nil
}

// NewRecord builds the Kafka record for already-encoded envelope bytes (value) of env.
func NewRecord(topic string, env *envelope.Envelope, layout envelope.Layout, value, key []byte) *kgo.Record {
	r := &kgo.Record{Topic: topic, Key: PartitionKey(env, key), Value: value, Headers: Headers(env, layout)}
	if ts := env.Header.GetMetadata().GetPublishedAtMs(); ts > 0 {
		r.Timestamp = time.UnixMilli(ts)
	}
	return r
}

func bindingErr(what, path, hint string) error {
	return prismerr.New("bad_binding", what, hint).At(path)
}

// DecodeOptions tune DecodeRecord. Keys, when set, verify the signature on the received
// bytes before anything is decoded.
type DecodeOptions struct {
	Keys   *signing.Keys
	Limits *envelope.Limits
}

// DecodeRecord decodes a record's value and checks its prism-* headers against the
// envelope. The layout comes from prism-envelope-layout (or prism-envelope-version, which
// means draft) and must match the bytes. With Keys the signature is verified first.
func DecodeRecord(r *kgo.Record, opts DecodeOptions) (*envelope.Envelope, *signing.Info, error) {
	if len(r.Value) == 0 {
		return nil, nil, bindingErr("kafka record has no value (tombstone)", "kafka value", "tombstones carry no envelope; skip them before decoding")
	}
	limits := envelope.DefaultLimits
	if opts.Limits != nil {
		limits = *opts.Limits
	}
	if len(r.Value) > limits.MaxMessageBytes {
		return nil, nil, prismerr.Newf("too_large", "envelope is %d bytes, over the %d-byte limit", len(r.Value), limits.MaxMessageBytes)
	}
	found := map[string]string{}
	for _, h := range r.Headers {
		name := strings.ToLower(h.Key)
		if !isChecked(name) {
			continue
		}
		if !utf8.Valid(h.Value) {
			return nil, nil, bindingErr("kafka header "+h.Key+" is not valid UTF-8", h.Key, "")
		}
		v := string(h.Value)
		if prev, ok := found[name]; ok && prev != v {
			return nil, nil, bindingErr("kafka header "+h.Key+" appears twice with different values", h.Key, "send each prism header once")
		}
		found[name] = v
	}
	// within the header limit: an unbounded walk of a 16 MiB value of tiny records is millions
	// of records before the decode below would refuse the header (envelope.ScanEnvelope)
	recs, err := envelope.ScanEnvelope(r.Value, envelope.Auto, limits.MaxHeaderBytes)
	if err != nil {
		return nil, nil, err
	}
	detected, err := envelope.LayoutOfRecords(recs)
	if err != nil {
		return nil, nil, err
	}
	layout := detected
	if v, ok := found[HeaderEnvelopeLayout]; ok {
		switch v {
		case "draft":
			layout = envelope.Draft
		case "reviewed":
			layout = envelope.Reviewed
		default:
			return nil, nil, bindingErr("unknown envelope layout "+strconv.Quote(clip(v)), HeaderEnvelopeLayout, "expected draft or reviewed")
		}
	} else if _, ok := found[HeaderEnvelopeVersion]; ok {
		layout = envelope.Draft
	}
	if v, ok := found[HeaderEnvelopeVersion]; ok {
		if v != DraftEnvelopeVersion {
			return nil, nil, bindingErr("unsupported envelope version "+strconv.Quote(clip(v)), HeaderEnvelopeVersion, "this client reads envelope version 1 (draft layout)")
		}
		if layout != envelope.Draft {
			return nil, nil, bindingErr("a version header was sent with the reviewed layout, which has no version", HeaderEnvelopeVersion, "send prism-envelope-version only with draft-layout envelopes")
		}
	}
	if detected != layout {
		return nil, nil, bindingErr("headers say the "+layout.String()+" layout but the bytes are a "+detected.String()+"-layout envelope",
			HeaderEnvelopeLayout, "the producer set the wrong layout header, or the value was replaced without its headers")
	}
	var env *envelope.Envelope
	var info *signing.Info
	if opts.Keys != nil {
		e, i, err := signing.VerifyAndDecode(r.Value, opts.Keys, signing.VerifyOptions{Layout: layout, Limits: &limits})
		if err != nil {
			return nil, nil, err
		}
		env, info = e, &i
	} else {
		e, _, err := envelope.DecodeWith(r.Value, envelope.DecodeOptions{Layout: layout, Limits: &limits})
		if err != nil {
			return nil, nil, err
		}
		env = e
	}
	for _, f := range fieldValues(env) {
		if v, ok := found[f[0]]; ok && v != f[1] {
			return nil, nil, bindingErr("kafka header "+f[0]+" is "+strconv.Quote(clip(v))+" but the envelope says "+strconv.Quote(clip(f[1])),
				f[0], "headers and envelope must come from one encode; re-encode instead of editing headers")
		}
	}
	return env, info, nil
}

func isChecked(name string) bool {
	switch name {
	case HeaderEnvelopeVersion, HeaderEnvelopeLayout, HeaderMessageID, HeaderTopic, HeaderNamespace, HeaderTraceID, HeaderContentType:
		return true
	}
	return false // other prism-* headers are from newer producers: ignored, like unknown fields
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
