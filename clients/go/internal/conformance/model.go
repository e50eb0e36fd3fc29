package conformance

import (
	"encoding/hex"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
)

// ModelJSON renders a decoded envelope in the suite's JSON form: the header plus the payload,
// normalized as Normalize does (numbers as float64, to compare with decoded vectors).
func ModelJSON(env *envelope.Envelope) (any, error) {
	m, err := ModelRaw(env)
	if err != nil {
		return nil, err
	}
	return Normalize(m), nil
}

// ModelRaw is ModelJSON without the normalization: integers keep their exact value (what a
// JSON encoder should write, e.g. for the cross-language tests).
func ModelRaw(env *envelope.Envelope) (map[string]any, error) {
	m := toJSON(env.Header.ProtoReflect())
	if env.Payload.Present() {
		p := map[string]any{}
		tu, err := env.Payload.TypeURL()
		if err != nil {
			return nil, err
		}
		v, _ := env.Payload.Value()
		if tu != "" {
			p["type_url"] = tu
		}
		if len(v) > 0 {
			p["value"] = hex.EncodeToString(v)
		}
		m["payload"] = p
	}
	return m, nil
}

// EnvelopeFromModel builds an Envelope from the JSON form of the model.
func EnvelopeFromModel(model map[string]any) (*envelope.Envelope, error) {
	h := &reviewedpb.PrismEnvelope{}
	rest := map[string]any{}
	for k, v := range model {
		if k != "payload" {
			rest[k] = v
		}
	}
	if err := FromJSON(rest, h.ProtoReflect()); err != nil {
		return nil, err
	}
	env := &envelope.Envelope{Header: h, Payload: envelope.AbsentPayload()}
	if p, ok := model["payload"].(map[string]any); ok {
		tu, _ := p["type_url"].(string)
		var val []byte
		if s, ok := p["value"].(string); ok {
			val, _ = hex.DecodeString(s)
		}
		env.Payload = envelope.NewPayload(tu, val)
	}
	return env, nil
}
