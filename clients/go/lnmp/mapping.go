package lnmp

import (
	"encoding/binary"
	"math"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"google.golang.org/protobuf/proto"
)

// Content types and extension keys of the mapping (app/formats/lnmp_envelope.py).
const (
	ContentTypeBinary = "application/lnmp"
	ContentTypeText   = "text/lnmp"
	ExtSequence       = "lnmp.sequence"
	ExtTraceID        = "lnmp.trace_id"
	ExtMode           = "lnmp.mode"
	ExtFlags          = "lnmp.flags"
	ExtModeMetadata   = "lnmp.mode_metadata"
	ExtTLV            = "lnmp.tlv"
	ExtTextKeys       = "lnmp.text_keys"
)

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

// traceParent is a parsed W3C traceparent (the Python worker's parse_traceparent rules).
type traceParent struct {
	version, traceID, parentID string
	flags                      int
}

func isHexLC(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func parseTraceparent(value string) *traceParent {
	for i := 0; i < len(value); i++ {
		if value[i] >= 0x80 {
			return nil // non-ASCII cannot be valid trace context
		}
	}
	text := strings.Trim(value, " \t")
	n := len(text)
	if n < 55 || n > 512 {
		return nil
	}
	version := text[0:2]
	if text[2] != '-' || !isHexLC(version) || version == "ff" {
		return nil
	}
	if version == "00" && n != 55 {
		return nil
	}
	tid, pid, flags := text[3:35], text[36:52], text[53:55]
	if text[35] != '-' || text[52] != '-' || (n > 55 && text[55] != '-') {
		return nil
	}
	if !isHexLC(tid) || !isHexLC(pid) || !isHexLC(flags) || tid == strings.Repeat("0", 32) || pid == strings.Repeat("0", 16) {
		return nil
	}
	f, _ := strconv.ParseUint(flags, 16, 8)
	return &traceParent{version, tid, pid, int(f)}
}

func (t *traceParent) propagated() int {
	if t.version == "00" {
		return t.flags & 0x03
	}
	return t.flags & 0x01
}

func (t *traceParent) header() string {
	return "00-" + t.traceID + "-" + t.parentID + "-" + hex2(t.propagated())
}

func hex2(n int) string {
	s := strconv.FormatInt(int64(n), 16)
	if len(s) < 2 {
		s = "0" + s
	}
	return s
}

func ext(env *envelope.Envelope, key string, value []byte) {
	if env.Header.Extensions == nil {
		env.Header.Extensions = map[string][]byte{}
	}
	env.Header.Extensions[key] = value
}

func obs(env *envelope.Envelope) *reviewedpb.ObservabilityContext {
	if env.Header.Observability == nil {
		env.Header.Observability = &reviewedpb.ObservabilityContext{}
	}
	return env.Header.Observability
}

// applyMetadata copies LNMP envelope metadata onto env (the mapping table, strict mode).
func applyMetadata(env *envelope.Envelope, meta *Envelope) error {
	if meta.Timestamp != nil {
		if *meta.Timestamp < 1 || *meta.Timestamp > math.MaxInt64 {
			return bad("LNMP timestamp "+strconv.FormatUint(*meta.Timestamp, 10)+" is not a usable publish time", "timestamp",
				"send Unix epoch milliseconds between 1 and 2^63-1")
		}
		env.Metadata().PublishedAtMs = int64(*meta.Timestamp)
	}
	if meta.Source != nil && *meta.Source != "" {
		env.EnsureSecurity().PublisherId = proto.String(*meta.Source)
	}
	if meta.TraceID != nil {
		tid := *meta.TraceID
		keep := true
		if tp := parseTraceparent(tid); tp != nil {
			o := obs(env)
			o.TraceId, o.SpanId, o.TraceFlags = tp.traceID, tp.parentID, int32(tp.propagated())
			keep = tp.header() != tid
		} else if hex32.MatchString(tid) && tid != strings.Repeat("0", 32) {
			obs(env).TraceId = tid
			keep = false
		}
		if keep {
			ext(env, ExtTraceID, []byte(tid))
		}
	}
	if meta.Sequence != nil {
		ext(env, ExtSequence, binary.BigEndian.AppendUint64(nil, *meta.Sequence))
	}
	if len(meta.ExtraTLV) > 0 {
		b, err := EncodeTLV(&Envelope{ExtraTLV: meta.ExtraTLV})
		if err != nil {
			return err
		}
		ext(env, ExtTLV, b)
	}
	if len(meta.ExtraKeys) > 0 {
		line, err := EncodeTextHeader(&Envelope{ExtraKeys: meta.ExtraKeys})
		if err != nil {
			return err
		}
		ext(env, ExtTextKeys, []byte(line[len(TextKeyword)+1:]))
	}
	return nil
}

// ToEnvelope maps any LNMP message - a container, an #ENVELOPE text, or a bare record - to a
// Prism envelope (topic, namespace and ids are still to be filled by the caller).
func ToEnvelope(data []byte) (*envelope.Envelope, error) {
	env := &envelope.Envelope{Header: &reviewedpb.PrismEnvelope{}}
	if IsContainer(data) {
		c, err := DecodeContainer(data)
		if err != nil {
			return nil, err
		}
		env.Payload = envelope.NewPayload("", c.Record)
		envelope.SetContentType(env.Metadata(), ContentTypeBinary)
		if c.Mode != ModeBinary {
			ext(env, ExtMode, []byte{c.Mode})
		}
		if c.Flags != 0 {
			ext(env, ExtFlags, []byte{byte(c.Flags >> 8), byte(c.Flags)})
		}
		if len(c.ModeMetadata) > 0 {
			ext(env, ExtModeMetadata, c.ModeMetadata)
		}
		if c.Envelope != nil {
			if err := applyMetadata(env, c.Envelope); err != nil {
				return nil, err
			}
		}
		return env, nil
	}
	t, err := DecodeText(data)
	if err != nil {
		return nil, err
	}
	env.Payload = envelope.NewPayload("", t.Record)
	envelope.SetContentType(env.Metadata(), ContentTypeText)
	if t.Envelope != nil {
		if err := applyMetadata(env, t.Envelope); err != nil {
			return nil, err
		}
	} else if !HasTextHeader(data) && !utf8.Valid(data) {
		envelope.SetContentType(env.Metadata(), ContentTypeBinary) // a bare binary record
	}
	return env, nil
}

func extU64(env *envelope.Envelope, key string) (*uint64, error) {
	raw, ok := env.Header.GetExtensions()[key]
	if !ok {
		return nil, nil
	}
	if len(raw) != 8 {
		return nil, bad("extensions["+key+"] must be 8 bytes (u64 big-endian)", "extensions."+key, "")
	}
	v := binary.BigEndian.Uint64(raw)
	return &v, nil
}

// Metadata is the LNMP envelope metadata of a Prism envelope (the inverse of the mapping).
func Metadata(env *envelope.Envelope) (*Envelope, error) {
	out := &Envelope{}
	if ts := env.Header.GetMetadata().GetPublishedAtMs(); ts != 0 {
		if ts < 0 {
			return nil, bad("published_at_ms is negative: not an LNMP timestamp", "metadata.published_at_ms", "")
		}
		v := uint64(ts)
		out.Timestamp = &v
	}
	if s := env.Header.GetSecurity().GetPublisherId(); s != "" {
		out.Source = &s
	}
	exts := env.Header.GetExtensions()
	if raw, ok := exts[ExtTraceID]; ok {
		if !utf8.Valid(raw) {
			return nil, bad("extensions['lnmp.trace_id'] is not UTF-8", "extensions.lnmp.trace_id", "")
		}
		s := string(raw)
		out.TraceID = &s
	} else if o := env.Header.GetObservability(); o != nil {
		tp := &traceParent{"00", o.TraceId, o.SpanId, int(o.TraceFlags)}
		if o.TraceFlags >= 0 && o.TraceFlags <= 0xff && len(o.TraceId) == 32 && len(o.SpanId) == 16 && isHexLC(o.TraceId) && isHexLC(o.SpanId) &&
			o.TraceId != strings.Repeat("0", 32) && o.SpanId != strings.Repeat("0", 16) {
			s := tp.header()
			out.TraceID = &s
		} else if o.TraceId != "" {
			s := o.TraceId
			out.TraceID = &s
		}
	}
	var err error
	if out.Sequence, err = extU64(env, ExtSequence); err != nil {
		return nil, err
	}
	if raw, ok := exts[ExtTLV]; ok {
		e, err := DecodeTLV(raw)
		if err != nil {
			return nil, err
		}
		out.ExtraTLV = e.ExtraTLV
	}
	if raw, ok := exts[ExtTextKeys]; ok {
		if !utf8.Valid(raw) {
			return nil, bad("extensions['lnmp.text_keys'] is not UTF-8", "extensions.lnmp.text_keys", "")
		}
		e, err := ParseTextHeader(TextKeyword + " " + string(raw))
		if err != nil {
			return nil, err
		}
		out.ExtraKeys = e.ExtraKeys
	}
	return out, nil
}

// FromEnvelope writes an envelope as an LNMP message, canonically: the text form when its
// content type is text/lnmp (or text/x-lnmp), else a container. The record is the plaintext
// payload: an encrypted payload is refused (decrypt first).
func FromEnvelope(env *envelope.Envelope) ([]byte, error) {
	ct := strings.ToLower(strings.TrimSpace(strings.SplitN(envelope.ContentType(env.Header.GetMetadata()), ";", 2)[0]))
	record, err := env.PayloadBytes()
	if err != nil {
		return nil, err
	}
	meta, err := Metadata(env)
	if err != nil {
		return nil, err
	}
	if ct == ContentTypeText || ct == "text/x-lnmp" {
		return EncodeText(record, meta)
	}
	exts := env.Header.GetExtensions()
	c := &Container{Record: record, Envelope: meta, Mode: ModeBinary, ModeMetadata: exts[ExtModeMetadata]}
	if raw, ok := exts[ExtMode]; ok {
		if len(raw) != 1 {
			return nil, bad("extensions['lnmp.mode'] must be 1 byte", "extensions.lnmp.mode", "")
		}
		c.Mode = raw[0]
	}
	if raw, ok := exts[ExtFlags]; ok {
		if len(raw) != 2 {
			return nil, bad("extensions['lnmp.flags'] must be 2 bytes", "extensions.lnmp.flags", "")
		}
		c.Flags = binary.BigEndian.Uint16(raw)
	}
	return EncodeContainer(c)
}
