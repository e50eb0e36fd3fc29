package conformance

import (
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// ToJSON renders a message in the suite's JSON form (conformance/README.md, "The JSON form
// of a message"), normalized through encoding/json so that it compares with a vector's
// decoded JSON by reflect.DeepEqual.
func ToJSON(m protoreflect.Message) any {
	return Normalize(toJSON(m))
}

// Normalize round-trips a value through encoding/json (numbers become float64).
func Normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // test helper: the values built here always marshal
	}
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

func toJSON(m protoreflect.Message) map[string]any {
	out := map[string]any{}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		out[string(fd.Name())] = fieldJSON(fd, v)
		return true
	})
	if u := envelope.UnknownRecords(m); len(u) > 0 {
		out["_unknown"] = hex.EncodeToString(u)
	}
	return out
}

func fieldJSON(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch {
	case fd.IsMap():
		obj := map[string]any{}
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			obj[k.String()] = scalarJSON(fd.MapValue(), mv)
			return true
		})
		return obj
	case fd.IsList():
		l := v.List()
		arr := make([]any, l.Len())
		for i := range arr {
			arr[i] = scalarJSON(fd, l.Get(i))
		}
		return arr
	}
	return scalarJSON(fd, v)
}

func scalarJSON(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return toJSON(v.Message())
	case protoreflect.BytesKind:
		return hex.EncodeToString(v.Bytes())
	case protoreflect.EnumKind:
		return int64(v.Enum())
	}
	return v.Interface()
}

// FromJSON fills m from the JSON form (the inverse of ToJSON).
func FromJSON(obj map[string]any, m protoreflect.Message) error {
	fields := m.Descriptor().Fields()
	for name, val := range obj {
		if name == "_unknown" {
			b, err := hex.DecodeString(val.(string))
			if err != nil {
				return err
			}
			m.SetUnknown(b)
			continue
		}
		fd := fields.ByName(protoreflect.Name(name))
		if fd == nil {
			return fmt.Errorf("no field %q in %s", name, m.Descriptor().FullName())
		}
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for k, mv := range val.(map[string]any) {
				sv, err := scalarFromJSON(fd.MapValue(), mv, nil)
				if err != nil {
					return err
				}
				mp.Set(protoreflect.ValueOfString(k).MapKey(), sv)
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for _, item := range val.([]any) {
				sv, err := scalarFromJSON(fd, item, nil)
				if err != nil {
					return err
				}
				l.Append(sv)
			}
		case fd.Message() != nil:
			sub := m.Mutable(fd).Message()
			if err := FromJSON(val.(map[string]any), sub); err != nil {
				return err
			}
		default:
			sv, err := scalarFromJSON(fd, val, m)
			if err != nil {
				return err
			}
			m.Set(fd, sv)
		}
	}
	return nil
}

func scalarFromJSON(fd protoreflect.FieldDescriptor, val any, parent protoreflect.Message) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(val.(string)), nil
	case protoreflect.BytesKind:
		b, err := hex.DecodeString(val.(string))
		return protoreflect.ValueOfBytes(b), err
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(val.(bool)), nil
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(int32(val.(float64)))), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(val.(float64))), nil
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(val.(float64))), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(val.(float64))), nil
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(val.(float64))), nil
	case protoreflect.MessageKind:
		// map values of message type do not occur in the envelope
	}
	return protoreflect.Value{}, fmt.Errorf("unsupported kind %s for %s", fd.Kind(), fd.FullName())
}

// ToJSONRaw is ToJSON without the normalization: integers keep their exact value.
func ToJSONRaw(m protoreflect.Message) map[string]any { return toJSON(m) }
