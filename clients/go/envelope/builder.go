package envelope

import (
	"encoding/json"
	"time"

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

func build(topic, namespace string, typeURL string, value []byte, defaultCT string, o Options) (*Envelope, error) {
	if topic == "" || namespace == "" {
		return nil, prismerr.New("invalid_envelope", "topic and namespace are required", "pass both to the builder").At("metadata")
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
		if *o.Priority < 0 || *o.Priority > 10 {
			return nil, prismerr.Newf("invalid_envelope", "priority %d is outside 0-10", *o.Priority).At("metadata.priority")
		}
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
