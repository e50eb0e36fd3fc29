package registry

import (
	"encoding/json"
	"sort"
	"strings"

	"github.com/prism-envelope/prism/clients/go/prismerr"
	"google.golang.org/protobuf/proto"
)

// Mask replaces a PII field's value (as in the Python SDK).
const Mask = "***"

// MaxDepth: payload nesting deeper than this is masked whole, so an untrusted payload cannot
// make the walk unbounded or skip a field.
const MaxDepth = 64

// node is a payload field: whether it is PII, and its own fields (shared between every use
// of one definition, so recursive types stay finite). keyed: a map, whose next segment is a key.
type node struct {
	pii    bool
	fields map[string]*node
	keyed  bool
}

func newNode() *node { return &node{fields: map[string]*node{}} }

func isPII(tags map[string]string) bool {
	if t, ok := tags["pii"]; ok {
		switch strings.ToLower(strings.TrimSpace(t)) {
		case "none", "false", "":
			return false
		}
		return true
	}
	return tags["encrypt"] != ""
}

func tagString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// jsonTree builds the PII tree of a JSON Schema: x-prism-pii / x-prism-encrypt tags on
// properties, items (transparent), anyOf/oneOf/allOf, additionalProperties (a map), local $refs.
func jsonTree(text string) (*node, error) {
	var root any
	if err := json.Unmarshal([]byte(text), &root); err != nil {
		return nil, err
	}
	memo := map[string]*node{}
	deref := func(n any) (any, string) {
		m, ok := n.(map[string]any)
		if !ok {
			return n, ""
		}
		ref, ok := m["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#") {
			return n, ""
		}
		target := root
		if len(ref) > 1 {
			for _, part := range strings.Split(ref[2:], "/") {
				part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
				if tm, ok := target.(map[string]any); ok {
					target = tm[part]
				} else {
					target = nil
				}
			}
		}
		return target, ref
	}
	var build func(schema any, into *node, depth int)
	build = func(schema any, into *node, depth int) {
		schema, ref := deref(schema)
		m, ok := schema.(map[string]any)
		if !ok || depth > 32 {
			return
		}
		if ref != "" {
			if known, ok := memo[ref]; ok {
				if known != into {
					for k, v := range known.fields {
						into.fields[k] = v
					}
				}
				return
			}
			memo[ref] = into
		}
		props, _ := m["properties"].(map[string]any)
		for name, sub := range props {
			sm, ok := sub.(map[string]any)
			if !ok {
				continue
			}
			tags := map[string]string{}
			for _, k := range []string{"pii", "encrypt"} {
				if v, ok := sm["x-prism-"+k]; ok {
					tags[k] = tagString(v)
				}
			}
			child := into.fields[name]
			if child == nil {
				child = newNode()
			}
			child.pii = child.pii || isPII(tags)
			into.fields[name] = child
			build(sm, child, depth+1)
		}
		if items, ok := m["items"].(map[string]any); ok {
			build(items, into, depth+1)
		}
		for _, key := range []string{"anyOf", "oneOf", "allOf"} {
			branches, _ := m[key].([]any)
			for _, b := range branches {
				build(b, into, depth+1)
			}
		}
		if extra, ok := m["additionalProperties"].(map[string]any); ok && len(props) == 0 {
			into.keyed = true
			build(extra, into, depth+1)
		}
	}
	top := newNode()
	build(root, top, 0)
	return top, nil
}

// avroTree builds the PII tree of an Avro schema: prism.pii / prism.encrypt on record
// fields, arrays (transparent), maps (keyed), unions and named types.
func avroTree(text string) (*node, error) {
	var root any
	if err := json.Unmarshal([]byte(text), &root); err != nil {
		return nil, err
	}
	named := map[string]any{}
	var collect func(t any, ns string, depth int)
	collect = func(t any, ns string, depth int) {
		if depth > 64 {
			return
		}
		switch v := t.(type) {
		case []any:
			for _, b := range v {
				collect(b, ns, depth+1)
			}
		case map[string]any:
			if name, ok := v["name"].(string); ok {
				n := ns
				if s, ok := v["namespace"].(string); ok {
					n = s
				}
				full := name
				if !strings.Contains(name, ".") && n != "" {
					full = n + "." + name
				}
				named[full], named[name] = v, v
				ns = n
			}
			if fs, ok := v["fields"].([]any); ok {
				for _, f := range fs {
					if fm, ok := f.(map[string]any); ok {
						collect(fm["type"], ns, depth+1)
					}
				}
			}
			for _, k := range []string{"items", "values", "type"} {
				if sub, ok := v[k]; ok {
					if _, isStr := sub.(string); !isStr {
						collect(sub, ns, depth+1)
					}
				}
			}
		}
	}
	collect(root, "", 0)
	seen := map[string]*node{}
	var build func(t any, into *node, depth int)
	build = func(t any, into *node, depth int) {
		if depth > 32 {
			return
		}
		if s, ok := t.(string); ok {
			if n, ok := named[s]; ok {
				t = n
			}
		}
		switch v := t.(type) {
		case []any:
			for _, b := range v {
				build(b, into, depth+1)
			}
		case map[string]any:
			kind := v["type"]
			switch kind {
			case "record", "error":
				key, _ := v["name"].(string)
				if known, ok := seen[key]; ok && key != "" {
					if known != into {
						for k, n := range known.fields {
							into.fields[k] = n
						}
					}
					return
				}
				if key != "" {
					seen[key] = into
				}
				fs, _ := v["fields"].([]any)
				for _, f := range fs {
					fm, ok := f.(map[string]any)
					if !ok {
						continue
					}
					tags := map[string]string{}
					for _, k := range []string{"pii", "encrypt"} {
						if tv, ok := fm["prism."+k]; ok {
							tags[k] = tagString(tv)
						}
					}
					child := newNode()
					child.pii = isPII(tags)
					name, _ := fm["name"].(string)
					into.fields[name] = child
					build(fm["type"], child, depth+1)
				}
			case "array":
				build(v["items"], into, depth+1)
			case "map":
				into.keyed = true
				build(v["values"], into, depth+1)
			default:
				if s, ok := kind.(string); ok {
					if _, ok := named[s]; ok {
						build(s, into, depth+1)
					}
				} else if kind != nil {
					build(kind, into, depth+1)
				}
			}
		}
	}
	top := newNode()
	build(root, top, 0)
	return top, nil
}

func (s *Schema) tree() (*node, error) {
	var t *node
	var err error
	text, terr := s.text()
	if terr != nil {
		return nil, terr
	}
	switch s.Kind() {
	case "json":
		t, err = jsonTree(text)
	case "avro":
		t, err = avroTree(text)
	case "protobuf":
		md, perr := s.rootMessage()
		if perr != nil {
			return nil, perr
		}
		return protoTree(md), nil
	default:
		return nil, prismerr.New("payload_error", "PII masking of "+s.Kind()+" schemas is not implemented in the Go client", "").At("schema")
	}
	if err != nil {
		return nil, prismerr.New("payload_error", "the schema is not valid JSON: "+err.Error(), "").At("schema")
	}
	return t, nil
}

// MaskPII returns a copy of a decoded payload with every field the schema tags as PII
// masked: a JSON value or Avro datum (maps, slices, scalars, as encoding/json and Decode
// produce them) gets Mask in place of each PII field; a protobuf message (Decode's
// *dynamicpb.Message) is cloned and masked as MaskProto masks. A field is PII when the schema
// tags it, or when a field enclosing it is; untagged means not PII. value is never changed.
func (s *Schema) MaskPII(value any) (any, error) {
	if m, ok := value.(proto.Message); ok {
		md := m.ProtoReflect().Descriptor()
		if s.Kind() != "protobuf" {
			return nil, prismerr.New("payload_error", "a protobuf message cannot be masked by a "+s.Kind()+" schema", "").At("payload")
		}
		out := proto.Clone(m)
		maskMessage(out.ProtoReflect(), protoTree(md), 0)
		return out, nil
	}
	t, err := s.tree()
	if err != nil {
		return nil, err
	}
	return mask(value, t, 0), nil
}

// MaskJSON is MaskPII for JSON bytes.
func (s *Schema) MaskJSON(payload []byte) ([]byte, error) {
	var v any
	if err := json.Unmarshal(payload, &v); err != nil {
		return nil, prismerr.New("payload_error", "payload is not valid JSON: "+err.Error(), "").At("payload")
	}
	m, err := s.MaskPII(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(m)
}

// PIIPaths lists the schema's PII fields as dotted paths (arrays transparent), sorted.
func (s *Schema) PIIPaths() ([]string, error) {
	t, err := s.tree()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[*node]bool{}
	var walk func(n *node, prefix string)
	walk = func(n *node, prefix string) {
		if seen[n] {
			return
		}
		seen[n] = true
		for name, c := range n.fields {
			p := name
			if prefix != "" {
				p = prefix + "." + name
			}
			if c.pii {
				out = append(out, p)
				continue
			}
			if c.keyed {
				p += ".*" // a map: the next segment is any key, as the Python SDK writes it
			}
			walk(c, p)
		}
		delete(seen, n)
	}
	walk(t, "")
	sort.Strings(out)
	return out, nil
}

func mask(value any, n *node, depth int) any {
	if depth > MaxDepth {
		return Mask
	}
	switch v := value.(type) {
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, item := range v {
			child := n.fields[k]
			switch {
			case child == nil:
				out[k] = mask(item, newNode(), depth+1)
			case child.pii:
				out[k] = Mask
			case child.keyed:
				if im, ok := item.(map[string]any); ok {
					mm := make(map[string]any, len(im))
					for key, x := range im {
						mm[key] = mask(x, child, depth+2)
					}
					out[k] = mm
				} else {
					out[k] = mask(item, child, depth+1)
				}
			default:
				out[k] = mask(item, child, depth+1)
			}
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, item := range v {
			out[i] = mask(item, n, depth+1)
		}
		return out
	}
	return value
}
