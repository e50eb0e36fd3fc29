package envelope

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
)

// Options are the optional header fields of a new envelope (Python's new_envelope keywords).
// Zero values mean "not set"; pointers distinguish an explicit zero where memo-031 does.
type Options struct {
	ContentType        string // default: by payload kind
	ContentEncoding    string // gzip, snappy or zstd compresses the payload here
	MessageID          string // default: a fresh UUIDv7
	PublishedAt        time.Time
	Priority           *int32
	TTLSeconds         *int64
	CorrelationID      string
	CausalityParent    string
	Labels             map[string]string
	Extensions         map[string][]byte
	DataClassification string
	ContainsPII        *bool
	ProducerSDKVersion string // default: SDKVersion
}

// SDKVersion is what this client writes into metadata.producer_sdk_version.
const SDKVersion = "prism-go/0.1.0"

// The worker's metadata limits (its sanity check dead-letters an envelope over them), checked
// when an envelope is built so that a producer hears of its mistake, not its consumers.
const (
	maxIDLength    = 128 // message_id, correlation_id, causality_parent
	maxNameLength  = 249 // topic (Kafka's own limit), namespace, content type and encoding
	maxLabels      = 64
	maxLabelLength = 256 // a label's key and value together
)

var classifications = map[string]bool{"public": true, "internal": true, "confidential": true, "restricted": true}

// textProblem says why s cannot be an envelope string: not UTF-8 (proto
// would refuse it at Marshal), over longest characters, or a control character (the
// worker's sanity rule).
func textProblem(s string, longest int) string {
	if !utf8.ValidString(s) {
		return "is not valid UTF-8"
	}
	if n := utf8.RuneCountInString(s); n > longest { // characters, as the worker counts them
		return fmt.Sprintf("is %d characters, over %d", n, longest)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return "contains control characters"
		}
	}
	return ""
}

// IDProblem says why id cannot be an envelope id (message, correlation or causality id) by
// the worker's metadata checks: over 128 characters, not UTF-8, or a control character; ""
// when it can. Audit records ask it before quoting a received message's id.
func IDProblem(id string) string { return textProblem(id, maxIDLength) }

// NameProblem says why s cannot be an envelope's topic or namespace: over 249 characters,
// not UTF-8, or a control character; "" when it can. Clients check their namespace with it
// when they are created.
func NameProblem(s string) string { return textProblem(s, maxNameLength) }

// optionProblems lists every problem of o at once, each with its field path.
func optionProblems(topic, namespace string, o Options) []string {
	var out []string
	add := func(path, why string) {
		if why != "" {
			out = append(out, path+" "+why)
		}
	}
	for _, f := range []struct{ path, v string }{{"metadata.topic", topic}, {"metadata.namespace", namespace}} {
		if f.v == "" {
			add(f.path, "is required")
		}
		add(f.path, textProblem(f.v, maxNameLength))
	}
	for _, f := range []struct{ path, v string }{{"metadata.message_id", o.MessageID},
		{"metadata.correlation_id", o.CorrelationID}, {"metadata.causality_parent", o.CausalityParent}} {
		add(f.path, textProblem(f.v, maxIDLength))
	}
	add("metadata.content_type", textProblem(o.ContentType, maxNameLength))
	add("metadata.content_encoding", textProblem(o.ContentEncoding, maxNameLength))
	if o.Priority != nil && (*o.Priority < 0 || *o.Priority > 10) {
		add("metadata.priority", fmt.Sprintf("%d is outside 0-10", *o.Priority))
	}
	if o.TTLSeconds != nil && *o.TTLSeconds < 0 {
		add("metadata.ttl_seconds", fmt.Sprintf("must be >= 0, got %d", *o.TTLSeconds))
	}
	if o.DataClassification != "" && !classifications[o.DataClassification] {
		add("security.data_classification", fmt.Sprintf("must be public, internal, confidential or restricted, got %q",
			o.DataClassification))
	}
	if len(o.Labels) > maxLabels {
		add("observability.labels", fmt.Sprintf("has %d entries, over %d", len(o.Labels), maxLabels))
	}
	for k, v := range o.Labels {
		why := textProblem(k, maxLabelLength)
		if why == "" {
			why = textProblem(v, maxLabelLength-utf8.RuneCountInString(k))
		}
		add(fmt.Sprintf("observability.labels[%q]", truncate(k, 32)), why)
	}
	for k := range o.Extensions {
		add(fmt.Sprintf("extensions[%q]", truncate(k, 32)), textProblem(k, maxLabelLength))
	}
	sort.Strings(out) // map order is random: the same mistake reads the same every time
	return out
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func build(topic, namespace string, typeURL string, value []byte, defaultCT string, o Options) (*Envelope, error) {
	if problems := optionProblems(topic, namespace, o); len(problems) > 0 {
		return nil, prismerr.New("invalid_envelope", strings.Join(problems, "; "),
			"fix every field listed; the limits are the worker's metadata checks (docs/sdk.md, PrismPublishOptions)")
	}
	md := &reviewedpb.PrismMetadata{Topic: topic, Namespace: namespace, MessageId: o.MessageID}
	if md.MessageId == "" {
		md.MessageId = NewMessageID()
	}
	if o.PublishedAt.IsZero() {
		md.PublishedAtMs = time.Now().UnixMilli()
	} else {
		md.PublishedAtMs = o.PublishedAt.UnixMilli()
	}
	ct := o.ContentType
	if ct == "" {
		ct = defaultCT
	}
	SetContentType(md, ct)
	if o.ContentEncoding != "" {
		SetContentEncoding(md, o.ContentEncoding)
		var err error
		if value, err = Compress(value, o.ContentEncoding); err != nil {
			return nil, err
		}
	}
	if o.Priority != nil {
		md.Priority = proto.Int32(*o.Priority)
	}
	if o.TTLSeconds != nil {
		md.TtlSeconds = proto.Int64(*o.TTLSeconds)
	}
	if o.CorrelationID != "" {
		md.CorrelationId = proto.String(o.CorrelationID)
	}
	if o.CausalityParent != "" {
		md.CausalityParent = proto.String(o.CausalityParent)
	}
	v := o.ProducerSDKVersion
	if v == "" {
		v = SDKVersion
	}
	md.ProducerSdkVersion = proto.String(v)
	h := &reviewedpb.PrismEnvelope{Metadata: md}
	if len(o.Labels) > 0 {
		h.Observability = &reviewedpb.ObservabilityContext{Labels: o.Labels}
	}
	if len(o.Extensions) > 0 {
		h.Extensions = o.Extensions
	}
	if o.DataClassification != "" || o.ContainsPII != nil {
		h.Security = &reviewedpb.SecurityContext{}
		if o.DataClassification != "" {
			h.Security.DataClassification = proto.String(o.DataClassification)
		}
		if o.ContainsPII != nil {
			h.Security.ContainsPii = proto.Bool(*o.ContainsPII)
		}
	}
	return &Envelope{Header: h, Payload: NewPayload(typeURL, value)}, nil
}

// NewBytes builds an envelope around raw bytes (no content type unless Options says one).
func NewBytes(topic, namespace string, payload []byte, o Options) (*Envelope, error) {
	return build(topic, namespace, "", payload, "", o)
}

// NewText builds an envelope around text (content type text/plain; charset=utf-8).
func NewText(topic, namespace, payload string, o Options) (*Envelope, error) {
	return build(topic, namespace, "", []byte(payload), "text/plain; charset=utf-8", o)
}

// NewJSON builds an envelope around any JSON-marshalable value of type T, as compact JSON
// with content type application/json. The type parameter keeps the call site typed:
// NewJSON[Order](...) accepts only an Order.
func NewJSON[T any](topic, namespace string, payload T, o Options) (*Envelope, error) {
	b, err := json.Marshal(payload)
	if err != nil {
		return nil, (&prismerr.Error{Code: "payload_error", What: "payload cannot be marshalled as JSON: " + err.Error(), Path: "payload"}).Wrap(err)
	}
	return build(topic, namespace, "", b, "application/json", o)
}

// NewProto builds an envelope around a protobuf message, packed like Any.Pack (type URL
// type.googleapis.com/<full name>, content type application/protobuf).
func NewProto[M proto.Message](topic, namespace string, payload M, o Options) (*Envelope, error) {
	b, err := marshal.Marshal(payload)
	if err != nil {
		return nil, (&prismerr.Error{Code: "payload_error", What: "payload cannot be serialized: " + err.Error(), Path: "payload"}).Wrap(err)
	}
	tu := ProtobufTypeURLPrefix + string(payload.ProtoReflect().Descriptor().FullName())
	return build(topic, namespace, tu, b, "application/protobuf", o)
}

// JSONPayload decodes an envelope's JSON payload into a T: the typed twin of NewJSON.
func JSONPayload[T any](env *Envelope) (T, error) {
	var v T
	err := env.PayloadJSON(&v)
	return v, err
}
