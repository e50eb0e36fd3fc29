package registry

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/bufbuild/protocompile"
	"github.com/prism-envelope/prism/clients/go/envelope"
	_ "github.com/prism-envelope/prism/clients/go/gen/annotationspb" // registers prism/annotations.proto
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Protobuf schemas are compiled in Go with protocompile (no protoc needed), against
// prism/annotations.proto and the well-known types. The root message is the schema's first
// message (package-qualified), as in the Python SDK. Schema references (imports of other
// subjects) are files of their own: the client fetched them with the schema
// (references.go), and protocompile reads them by the import paths the references name.

const mainFile = "schema.proto"

var protoCache = struct {
	sync.Mutex
	m map[string]protoreflect.MessageDescriptor
}{m: map[string]protoreflect.MessageDescriptor{}}

func (s *Schema) rootMessage() (protoreflect.MessageDescriptor, error) {
	files := map[string]string{}
	if len(s.References) > 0 {
		if s.refs == nil {
			return nil, unresolved(s)
		}
		for k, v := range s.refs.imports {
			files[k] = v
		}
	}
	files[mainFile] = s.Text
	key := s.Text
	if len(files) > 1 {
		b, _ := json.Marshal(files) // map keys sorted: a stable key
		key = string(b)
	}
	protoCache.Lock()
	md, ok := protoCache.m[key]
	protoCache.Unlock()
	if ok {
		return md, nil
	}
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(protocompile.CompositeResolver{
		&protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(files)},
		protocompile.ResolverFunc(func(path string) (protocompile.SearchResult, error) {
			fd, err := protoregistry.GlobalFiles.FindFileByPath(path)
			if err != nil {
				return protocompile.SearchResult{}, err
			}
			return protocompile.SearchResult{Desc: fd}, nil
		}),
	})}
	compiled, err := c.Compile(context.Background(), mainFile)
	if err != nil {
		return nil, prismerr.New("payload_error", "the registry's protobuf schema does not compile: "+err.Error(),
			"an import must be prism/annotations.proto, a well-known type or one of the schema's references").At("schema")
	}
	msgs := compiled[0].Messages()
	if msgs.Len() == 0 {
		return nil, prismerr.New("payload_error", "the protobuf schema defines no message", "").At("schema")
	}
	md = msgs.Get(0)
	protoCache.Lock()
	if len(protoCache.m) > 256 {
		protoCache.m = map[string]protoreflect.MessageDescriptor{}
	}
	protoCache.m[key] = md
	protoCache.Unlock()
	return md, nil
}

// optionStrings reads the string values of custom field options 50430 (prism.pii) and 50431
// (prism.encrypt) from the options' wire bytes, however the compiler stored them.
func optionStrings(opts proto.Message) map[string]string {
	out := map[string]string{}
	if opts == nil {
		return out
	}
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(opts)
	if err != nil {
		return out
	}
	recs, err := envelope.Scan(raw)
	if err != nil {
		return out
	}
	for _, r := range recs {
		if r.WireType != envelope.WireLen {
			continue
		}
		switch r.Field {
		case 50430:
			out["pii"] = string(raw[r.ValueStart:r.End])
		case 50431:
			out["encrypt"] = string(raw[r.ValueStart:r.End])
		}
	}
	return out
}

// protoTree builds the PII tree of a message: fields tagged (prism.pii) or (prism.encrypt),
// nested messages, repeated fields (transparent) and maps (keyed, their values' fields).
// Both the field's name and its JSON name lead to the same node (JSON payloads use either).
func protoTree(md protoreflect.MessageDescriptor) *node {
	memo := map[protoreflect.FullName]*node{}
	var build func(md protoreflect.MessageDescriptor) *node
	build = func(md protoreflect.MessageDescriptor) *node {
		if n, ok := memo[md.FullName()]; ok {
			return n
		}
		n := newNode()
		memo[md.FullName()] = n
		fields := md.Fields()
		for i := 0; i < fields.Len(); i++ {
			f := fields.Get(i)
			child := newNode()
			child.pii = isPII(optionStrings(f.Options()))
			target := f.Message()
			if f.IsMap() {
				child.keyed = true
				target = f.MapValue().Message()
			}
			if target != nil {
				child.fields = build(target).fields
			}
			n.fields[string(f.Name())] = child
			n.fields[f.JSONName()] = child
		}
		return n
	}
	return build(md)
}

// MaskProto returns a copy of a binary protobuf payload of the schema's root message with
// every PII field masked: strings and bytes get Mask, other types are cleared (a number
// field cannot hold the mask), as in the Python SDK.
func (s *Schema) MaskProto(payload []byte) ([]byte, error) {
	if s.Kind() != "protobuf" {
		return nil, prismerr.New("payload_error", "MaskProto needs a protobuf schema, not "+s.Kind(), "use MaskJSON").At("schema")
	}
	md, err := s.rootMessage()
	if err != nil {
		return nil, err
	}
	msg := dynamicpb.NewMessage(md)
	if err := (proto.UnmarshalOptions{RecursionLimit: MaxDepth}).Unmarshal(payload, msg); err != nil {
		return nil, prismerr.New("payload_error", "payload is not a valid "+string(md.FullName())+": "+err.Error(), "").At("payload")
	}
	maskMessage(msg, protoTree(md), 0)
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(msg)
	if err != nil {
		return nil, prismerr.New("payload_error", "masked payload cannot be serialized: "+err.Error(), "").At("payload")
	}
	return out, nil
}

func maskField(m protoreflect.Message, fd protoreflect.FieldDescriptor) {
	if !fd.IsList() && !fd.IsMap() {
		switch fd.Kind() {
		case protoreflect.StringKind:
			m.Set(fd, protoreflect.ValueOfString(Mask))
			return
		case protoreflect.BytesKind:
			m.Set(fd, protoreflect.ValueOfBytes([]byte(Mask)))
			return
		}
	}
	if fd.IsList() && (fd.Kind() == protoreflect.StringKind || fd.Kind() == protoreflect.BytesKind) {
		l := m.Mutable(fd).List()
		for i := 0; i < l.Len(); i++ {
			if fd.Kind() == protoreflect.StringKind {
				l.Set(i, protoreflect.ValueOfString(Mask))
			} else {
				l.Set(i, protoreflect.ValueOfBytes([]byte(Mask)))
			}
		}
		return
	}
	m.Clear(fd)
}

func maskMessage(m protoreflect.Message, n *node, depth int) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.IsExtension() {
			return true
		}
		child := n.fields[string(fd.Name())]
		if child == nil {
			return true
		}
		if child.pii || depth > MaxDepth {
			maskField(m, fd)
			return true
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					maskMessage(mv.Message(), child, depth+1)
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					maskMessage(l.Get(i).Message(), child, depth+1)
				}
			}
		case fd.Message() != nil:
			maskMessage(v.Message(), child, depth+1)
		}
		return true
	})
}

// validateProto checks a payload is a valid root message: protobuf JSON mapping when the
// content type says JSON, the binary wire format otherwise.
func (s *Schema) validateProto(payload []byte, contentType string) error {
	md, err := s.rootMessage()
	if err != nil {
		return err
	}
	msg := dynamicpb.NewMessage(md)
	if strings.Contains(contentType, "json") {
		err = protojson.Unmarshal(payload, msg)
	} else {
		err = proto.UnmarshalOptions{RecursionLimit: MaxDepth}.Unmarshal(payload, msg)
	}
	if err != nil {
		return &ValidationError{Err: prismerr.New("schema_validation_failed", "payload is not a valid "+string(md.FullName())+": "+err.Error(),
			"fix the payload, or publish against another schema version").At("$"), Violations: []Violation{{"$", err.Error()}}}
	}
	return nil
}
