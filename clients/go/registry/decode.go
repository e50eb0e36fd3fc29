package registry

import (
	"bytes"
	stdjson "encoding/json"
	"strconv"
	"strings"

	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Decode returns a payload as this schema reads it, as the Python SDK's
// PayloadSchema.decode does:
//
//   - protobuf: a *dynamicpb.Message of the schema's root message, from the wire format, or
//     from the protobuf JSON mapping when the content type names JSON;
//   - Avro: the datum of a binary payload (trailing bytes refused), or the JSON document when
//     the content type names JSON (see avro_binary.go for the Go types of a datum);
//   - JSON Schema: the JSON value (encoding/json types, numbers as json.Number).
//
// A payload the schema cannot read is a payload_error (errors.Is(err, prismerr.ErrPayload)).
// The payload is untrusted: nesting is bounded by MaxDepth.
func (s *Schema) Decode(payload []byte, contentType string) (any, error) {
	json := strings.Contains(strings.ToLower(contentType), "json")
	bad := func(err error) error {
		msg := err.Error()
		if len(msg) > 200 {
			msg = msg[:200]
		}
		return prismerr.New("payload_error", "payload is not a valid "+s.Kind()+" value of schema "+quote(s.Subject)+
			" version "+strconv.Itoa(s.Version)+": "+msg, "read the raw bytes; the producer wrote something else").At("payload")
	}
	switch s.Kind() {
	case "protobuf":
		md, err := s.rootMessage()
		if err != nil {
			return nil, err
		}
		msg := dynamicpb.NewMessage(md)
		if json {
			if err := (protojson.UnmarshalOptions{RecursionLimit: MaxDepth}).Unmarshal(payload, msg); err != nil {
				return nil, bad(err)
			}
		} else if err := (proto.UnmarshalOptions{RecursionLimit: MaxDepth}).Unmarshal(payload, msg); err != nil {
			return nil, bad(err)
		}
		return msg, nil
	case "avro":
		if !json {
			text, err := s.text()
			if err != nil {
				return nil, err
			}
			datum, trailing, err := decodeAvroBinary(text, payload)
			if err != nil {
				if _, ok := err.(*avroErr); ok {
					return nil, bad(err)
				}
				return nil, err
			}
			if trailing > 0 {
				return nil, bad(prismerr.New("payload_error", strconv.Itoa(trailing)+" byte(s) after the Avro datum", ""))
			}
			return datum, nil
		}
	case "json":
	default:
		return nil, prismerr.New("payload_error", "decoding by a "+s.Kind()+" schema is not implemented", "").At("schema")
	}
	if d := jsonDepth(string(payload)); d > MaxDepth {
		return nil, bad(prismerr.New("payload_error", "JSON nests "+strconv.Itoa(d)+" deep, more than "+strconv.Itoa(MaxDepth), ""))
	}
	dec := stdjson.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, bad(err)
	}
	if dec.More() {
		return nil, bad(prismerr.New("payload_error", "data after the JSON value", ""))
	}
	return v, nil
}
