package registry

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"

	"github.com/prism-envelope/prism/clients/go/internal/untrustedjson"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Confluent schema references (a schema that imports or uses another registered schema),
// resolved as the registry resolves them (app/schema/references.py, Registry.effective):
//
//   - protobuf: each reference's name is an import path; the referenced texts (and their own
//     references, transitively) become the files protocompile reads for those imports;
//   - Avro: each reference names a named type; its definition is inlined at its first use, so
//     the schema parses alone (expandAvro, a port of expand_avro);
//   - JSON Schema: the referenced documents are bundled under $defs and the $refs pointed at
//     them (expandJSON, a port of expand_json).
//
// The client fetches references when it reads a schema (Version, SchemaByID, PrismVersion,
// PrismSchema), so every Schema it returns validates, decodes and masks on its own. Bounds,
// because a registry answer is input too: references nested at most 32 deep (the registry's
// own limit) and at most MaxReferences fetched per schema.

// MaxReferences is how many referenced versions one schema may pull in, transitively.
const MaxReferences = 256

const maxReferenceDepth = 32

// resolved holds what a schema's references resolve to.
type resolved struct {
	imports  map[string]string // protobuf: import path -> file text (transitive)
	expanded string            // Avro / JSON Schema: the self-contained text
}

// text is the schema's self-contained text: the Avro or JSON Schema with its references
// inlined, or Text when it has none.
func (s *Schema) text() (string, error) {
	if len(s.References) == 0 || s.Kind() == "protobuf" {
		return s.Text, nil
	}
	if s.refs == nil {
		return "", unresolved(s)
	}
	return s.refs.expanded, nil
}

func unresolved(s *Schema) error {
	return prismerr.New("payload_error", "schema "+quote(s.Subject)+" has "+strconv.Itoa(len(s.References))+
		" reference(s) that were not resolved", "read the schema with a registry.Client (it fetches references), or call Client.ResolveReferences").At("schema.references")
}

// ResolveReferences fetches the schemas s references (transitively) and keeps what they
// resolve to in s. The client's read methods call it; call it yourself for a Schema you
// built. A schema without references needs nothing.
func (c *Client) ResolveReferences(ctx context.Context, s *Schema) error {
	if len(s.References) == 0 {
		return nil
	}
	fetched := 0
	r, err := c.resolve(ctx, s.Kind(), s.Text, s.References, 0, &fetched)
	if err != nil {
		return err
	}
	s.refs = r
	return nil
}

func (c *Client) resolve(ctx context.Context, kind, text string, refs []Reference, depth int, fetched *int) (*resolved, error) {
	if depth >= maxReferenceDepth {
		return nil, prismerr.New("payload_error", "schema references nest more than "+strconv.Itoa(maxReferenceDepth)+" deep (a cycle?)", "").At("schema.references")
	}
	out := &resolved{imports: map[string]string{}}
	expanded := map[string]string{}
	var order []string
	for _, r := range refs {
		if *fetched >= MaxReferences {
			return nil, prismerr.New("payload_error", "schema pulls in more than "+strconv.Itoa(MaxReferences)+" referenced versions", "").At("schema.references")
		}
		*fetched++
		if r.Name == "" || r.Subject == "" {
			return nil, prismerr.New("payload_error", "a schema reference has no name or subject", "").At("schema.references")
		}
		version := "latest"
		if r.Version >= 1 {
			version = strconv.Itoa(r.Version)
		}
		target := &Schema{}
		if err := c.do(ctx, "GET", "/subjects/"+esc(r.Subject)+"/versions/"+esc(version), nil, target); err != nil {
			return nil, prismerr.New("payload_error", "reference "+quote(r.Name)+" (subject "+quote(r.Subject)+" version "+version+") cannot be read: "+err.Error(), "").At("schema.references")
		}
		inner, err := c.resolve(ctx, kind, target.Text, target.References, depth+1, fetched)
		if err != nil {
			return nil, err
		}
		for k, v := range inner.imports {
			out.imports[k] = v
		}
		out.imports[r.Name] = target.Text
		expanded[r.Name] = inner.expanded
		if len(target.References) == 0 {
			expanded[r.Name] = target.Text
		}
		order = append(order, r.Name)
	}
	var err error
	switch kind {
	case "protobuf":
		out.expanded = text
	case "avro":
		out.expanded, err = expandAvro(text, expanded, order)
	default:
		out.expanded, err = expandJSON(text, expanded, order)
	}
	if err != nil {
		return nil, prismerr.New("payload_error", "schema references do not resolve: "+err.Error(), "").At("schema.references")
	}
	return out, nil
}

// -- Avro ---------------------------------------------------------------------------------

var avroPrims = map[string]bool{"null": true, "boolean": true, "int": true, "long": true, "float": true, "double": true, "bytes": true, "string": true}

func avroNamedKind(t any) bool {
	switch t {
	case "record", "error", "enum", "fixed":
		return true
	}
	return false
}

func avroFullname(n map[string]any, ns string) string {
	name, _ := n["name"].(string)
	if strings.Contains(name, ".") {
		return name
	}
	space := ns
	if s, ok := n["namespace"].(string); ok {
		space = s
	}
	if space != "" {
		return space + "." + name
	}
	return name
}

func parentNS(full string) string {
	if i := strings.LastIndex(full, "."); i >= 0 {
		return full[:i]
	}
	return ""
}

func avroDefined(n any, ns string, out map[string]map[string]any, depth int) {
	if depth > MaxDepth {
		return
	}
	switch v := n.(type) {
	case []any:
		for _, b := range v {
			avroDefined(b, ns, out, depth+1)
		}
	case map[string]any:
		t := v["type"]
		if _, hasName := v["name"]; avroNamedKind(t) && hasName {
			full := avroFullname(v, ns)
			out[full] = v
			fs, _ := v["fields"].([]any)
			for _, f := range fs {
				if fm, ok := f.(map[string]any); ok {
					avroDefined(fm["type"], parentNS(full), out, depth+1)
				}
			}
		} else if t == "array" {
			avroDefined(v["items"], ns, out, depth+1)
		} else if t == "map" {
			avroDefined(v["values"], ns, out, depth+1)
		} else if _, ok := t.(string); !ok && t != nil {
			avroDefined(t, ns, out, depth+1)
		}
	}
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = deepCopy(e)
		}
		return l
	}
	return v
}

// expandAvro inlines the referenced named types at their first use (app/schema/references.py
// expand_avro): every named type a referenced schema defines becomes known, and an inlined
// definition gets an explicit namespace so that moving it does not rename it.
func expandAvro(text string, referenced map[string]string, order []string) (string, error) {
	root, err := boundedJSON(text, "Avro schema")
	if err != nil {
		return "", err
	}
	available := map[string]map[string]any{}
	for _, name := range order {
		doc, err := boundedJSON(referenced[name], "referenced schema "+quote(name))
		if err != nil {
			return "", err
		}
		avroDefined(doc, "", available, 0)
	}
	defined := map[string]map[string]any{}
	avroDefined(root, "", defined, 0)
	var walk func(n any, ns string, depth int) any
	inline := func(full string, depth int) any {
		node := deepCopy(available[full]).(map[string]any)
		node["namespace"] = parentNS(full)
		node["name"] = full[strings.LastIndex(full, ".")+1:]
		avroDefined(node, "", defined, 0)
		return walk(node, node["namespace"].(string), depth+1)
	}
	resolveName := func(name, ns string) string {
		cands := []string{name}
		if !strings.Contains(name, ".") {
			cands = []string{name}
			if ns != "" {
				cands = []string{ns + "." + name, name}
			}
		}
		for _, c := range cands {
			if _, d := defined[c]; !d {
				if _, a := available[c]; a {
					return c
				}
			}
		}
		return ""
	}
	walk = func(n any, ns string, depth int) any {
		if depth > MaxDepth {
			return n
		}
		switch v := n.(type) {
		case string:
			if avroPrims[v] {
				return v
			}
			if full := resolveName(v, ns); full != "" {
				return inline(full, depth)
			}
			return v
		case []any:
			out := make([]any, len(v))
			for i, b := range v {
				out[i] = walk(b, ns, depth+1)
			}
			return out
		case map[string]any:
			t := v["type"]
			if _, hasName := v["name"]; avroNamedKind(t) && hasName {
				full := avroFullname(v, ns)
				if fs, ok := v["fields"].([]any); ok {
					nf := make([]any, len(fs))
					for i, f := range fs {
						fm, ok := f.(map[string]any)
						if !ok {
							nf[i] = f
							continue
						}
						c := make(map[string]any, len(fm))
						for k, e := range fm {
							c[k] = e
						}
						c["type"] = walk(fm["type"], parentNS(full), depth+1)
						nf[i] = c
					}
					v["fields"] = nf
				}
				return v
			}
			c := make(map[string]any, len(v))
			for k, e := range v {
				c[k] = e
			}
			switch {
			case t == "array":
				c["items"] = walk(v["items"], ns, depth+1)
			case t == "map":
				c["values"] = walk(v["values"], ns, depth+1)
			case t != nil:
				c["type"] = walk(t, ns, depth+1)
			}
			return c
		}
		return n
	}
	out, err := json.Marshal(walk(root, "", 0))
	return string(out), err
}

// -- JSON Schema ---------------------------------------------------------------------------

const bundlePrefix = "__prism_ref_"

func rewriteLocal(n any, prefix string, depth int) any {
	if depth > MaxDepth {
		return n
	}
	switch v := n.(type) {
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = rewriteLocal(e, prefix, depth+1)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = rewriteLocal(e, prefix, depth+1)
		}
		if ref, ok := v["$ref"].(string); ok && strings.HasPrefix(ref, "#") {
			out["$ref"] = prefix + ref[1:]
		}
		return out
	}
	return n
}

// expandJSON bundles the referenced schemas under $defs and points the $refs at them
// (app/schema/references.py expand_json).
func expandJSON(text string, referenced map[string]string, order []string) (string, error) {
	root, err := boundedJSON(text, "JSON Schema")
	if err != nil {
		return "", err
	}
	rootMap, ok := root.(map[string]any)
	if !ok || len(order) == 0 {
		return text, nil
	}
	keys := map[string]string{}
	for i, name := range order {
		keys[name] = bundlePrefix + strconv.Itoa(i)
	}
	var walk func(n any, depth int) any
	walk = func(n any, depth int) any {
		if depth > MaxDepth {
			return n
		}
		switch v := n.(type) {
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				out[i] = walk(e, depth+1)
			}
			return out
		case map[string]any:
			out := make(map[string]any, len(v))
			for k, e := range v {
				out[k] = walk(e, depth+1)
			}
			if ref, ok := v["$ref"].(string); ok && !strings.HasPrefix(ref, "#") {
				base, frag, _ := strings.Cut(ref, "#")
				if key, ok := keys[base]; ok {
					out["$ref"] = "#/$defs/" + key + frag
				}
			}
			return out
		}
		return n
	}
	bundled := walk(rootMap, 0).(map[string]any)
	defs, _ := bundled["$defs"].(map[string]any)
	if defs == nil {
		defs = map[string]any{}
	}
	for _, name := range order {
		doc, err := boundedJSON(referenced[name], "referenced schema "+quote(name))
		if err != nil {
			return "", err
		}
		key := keys[name]
		if m, ok := doc.(map[string]any); ok {
			delete(m, "$id")
			delete(m, "$schema")
		}
		defs[key] = rewriteLocal(doc, "#/$defs/"+key, 0)
	}
	bundled["$defs"] = defs
	out, err := json.Marshal(bundled)
	return string(out), err
}

// boundedJSON parses a schema document no deeper than MaxDepth (a registry answer is input:
// a 3,000-deep schema must be an error, not a deep recursion).
func boundedJSON(text, what string) (any, error) {
	if d := jsonDepth(text); d > MaxDepth {
		return nil, prismerr.New("payload_error", what+" nests "+strconv.Itoa(d)+" deep, more than "+strconv.Itoa(MaxDepth), "").At("schema")
	}
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return nil, prismerr.New("payload_error", what+" is not JSON: "+err.Error(), "").At("schema")
	}
	return v, nil
}

// jsonDepth is the bracket nesting of a JSON text (strings skipped), without parsing it.
func jsonDepth(text string) int { return untrustedjson.Depth([]byte(text)) }
