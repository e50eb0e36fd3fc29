package registry

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"strings"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// validateAvroJSON checks a JSON datum against an Avro schema with the rules of the Python
// SDK's validator (fastavro's validate): a record's missing field takes its default, extra
// keys are ignored, int/long must be integers in range, a union accepts a value of any
// branch, bytes and fixed cannot be written as JSON. The first violation is located as
// deep as possible, as in Python.
func validateAvroJSON(schemaText string, payload []byte) error {
	var schema any
	if err := json.Unmarshal([]byte(schemaText), &schema); err != nil {
		return prismerr.New("payload_error", "the registry's Avro schema is not JSON: "+err.Error(), "").At("schema")
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var datum any
	if err := dec.Decode(&datum); err != nil {
		return &ValidationError{Err: prismerr.New("schema_validation_failed", "payload is not JSON: "+err.Error(), "").At("$"),
			Violations: []Violation{{"$", "not JSON"}}}
	}
	a := &avroCheck{named: map[string]any{}}
	a.collect(schema, "", 0)
	if path, ok := a.locate(datum, schema, "$", 0); !ok {
		return &ValidationError{Err: prismerr.New("schema_validation_failed", "payload does not match the Avro schema at "+path,
			"fix the payload, or publish against another schema version").At(path),
			Violations: []Violation{{path, "avro: value does not match the field's type"}}}
	}
	return nil
}

type avroCheck struct {
	named map[string]any
}

func (a *avroCheck) collect(t any, ns string, depth int) {
	if depth > 64 {
		return
	}
	switch v := t.(type) {
	case []any:
		for _, b := range v {
			a.collect(b, ns, depth+1)
		}
	case map[string]any:
		if name, ok := v["name"].(string); ok {
			if s, ok := v["namespace"].(string); ok {
				ns = s
			}
			full := name
			if !strings.Contains(name, ".") && ns != "" {
				full = ns + "." + name
			}
			a.named[full], a.named[name] = v, v
		}
		if fs, ok := v["fields"].([]any); ok {
			for _, f := range fs {
				if fm, ok := f.(map[string]any); ok {
					a.collect(fm["type"], ns, depth+1)
				}
			}
		}
		for _, k := range []string{"items", "values", "type"} {
			if sub, ok := v[k]; ok {
				if _, isStr := sub.(string); !isStr {
					a.collect(sub, ns, depth+1)
				}
			}
		}
	}
}

func integer(d any, lo, hi float64) bool {
	n, ok := d.(json.Number)
	if !ok || strings.ContainsAny(string(n), ".eE") {
		return false
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	return err == nil && float64(i) >= lo && float64(i) <= hi
}

// valid reports whether datum matches schema t.
func (a *avroCheck) valid(d any, t any, depth int) bool {
	if depth > 64 {
		return false
	}
	switch v := t.(type) {
	case string:
		switch v {
		case "null":
			return d == nil
		case "boolean":
			_, ok := d.(bool)
			return ok
		case "int":
			return integer(d, math.MinInt32, math.MaxInt32)
		case "long":
			return integer(d, math.MinInt64, math.MaxInt64)
		case "float", "double":
			_, ok := d.(json.Number)
			return ok
		case "string":
			_, ok := d.(string)
			return ok
		case "bytes":
			return false // JSON has no bytes (as for Python's json.loads + fastavro)
		}
		if n, ok := a.named[v]; ok {
			return a.valid(d, n, depth+1)
		}
		return false
	case []any:
		for _, b := range v {
			if a.valid(d, b, depth+1) {
				return true
			}
		}
		return false
	case map[string]any:
		switch kind := v["type"].(type) {
		case string:
			switch kind {
			case "record", "error":
				m, ok := d.(map[string]any)
				if !ok {
					return false
				}
				fs, _ := v["fields"].([]any)
				for _, f := range fs {
					fm, _ := f.(map[string]any)
					name, _ := fm["name"].(string)
					val, present := m[name]
					if !present {
						val = fm["default"]
						if n, isNum := val.(float64); isNum {
							val = json.Number(strconv.FormatFloat(n, 'f', -1, 64))
						}
					}
					if !a.valid(val, fm["type"], depth+1) {
						return false
					}
				}
				return true
			case "enum":
				s, ok := d.(string)
				syms, _ := v["symbols"].([]any)
				for _, x := range syms {
					if ok && x == s {
						return true
					}
				}
				return false
			case "array":
				l, ok := d.([]any)
				if !ok {
					return false
				}
				for _, x := range l {
					if !a.valid(x, v["items"], depth+1) {
						return false
					}
				}
				return true
			case "map":
				m, ok := d.(map[string]any)
				if !ok {
					return false
				}
				for _, x := range m {
					if !a.valid(x, v["values"], depth+1) {
						return false
					}
				}
				return true
			case "fixed":
				return false
			default:
				return a.valid(d, kind, depth+1) // {"type": "int", "logicalType": ...} or a named type
			}
		default:
			return a.valid(d, kind, depth+1) // {"type": {...}} or {"type": [...]}
		}
	}
	return false
}

// locate returns the deepest path under path whose value does not match, and false; or true
// when the datum matches.
func (a *avroCheck) locate(d any, t any, path string, depth int) (string, bool) {
	if a.valid(d, t, depth) {
		return path, true
	}
	t = a.resolveName(t)
	if u, isUnion := t.([]any); isUnion { // a union: follow the one branch of the datum's shape, if one
		t = a.branchOfShape(d, u)
	}
	v, ok := t.(map[string]any)
	if !ok || depth > 64 {
		return path, false
	}
	switch v["type"] {
	case "record", "error":
		if m, ok := d.(map[string]any); ok {
			fs, _ := v["fields"].([]any)
			for _, f := range fs {
				fm, _ := f.(map[string]any)
				name, _ := fm["name"].(string)
				val, present := m[name]
				if !present {
					val = fm["default"]
				}
				if !a.valid(val, fm["type"], depth+1) {
					p, _ := a.locate(val, fm["type"], path+"."+name, depth+1)
					return p, false
				}
			}
		}
	case "array":
		if l, ok := d.([]any); ok {
			for i, x := range l {
				if !a.valid(x, v["items"], depth+1) {
					p, _ := a.locate(x, v["items"], path+"["+strconv.Itoa(i)+"]", depth+1)
					return p, false
				}
			}
		}
	case "map":
		if m, ok := d.(map[string]any); ok {
			for k, x := range m {
				if !a.valid(x, v["values"], depth+1) {
					p, _ := a.locate(x, v["values"], path+"."+k, depth+1)
					return p, false
				}
			}
		}
	}
	return path, false
}

// resolveName returns the named type a bare name refers to, or t itself.
func (a *avroCheck) resolveName(t any) any {
	if s, ok := t.(string); ok {
		if n, ok := a.named[s]; ok {
			return n
		}
	}
	return t
}

// branchOfShape returns the one union branch whose kind fits the datum's JSON shape (an
// object: record or map; a list: array), or nil when none or several do - as Python's locate
// does, so a violation inside a union's record is named by its field path.
func (a *avroCheck) branchOfShape(d any, union []any) any {
	var shape []string
	switch d.(type) {
	case map[string]any:
		shape = []string{"record", "map"}
	case []any:
		shape = []string{"array"}
	}
	var found []any
	for _, b := range union {
		if m, ok := a.resolveName(b).(map[string]any); ok {
			for _, k := range shape {
				if m["type"] == k {
					found = append(found, m)
				}
			}
		}
	}
	if len(found) == 1 {
		return found[0]
	}
	return nil
}
