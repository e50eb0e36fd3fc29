package registry

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
)

// TextHash is the schema hash Prism's Python side computes from a schema's text alone
// (app/schema/canonical.py schema_hash without references): for Avro and JSON Schema,
// sha256 of the parsed JSON written again with sorted keys, no whitespace and non-ASCII kept
// (Python's json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)). It
// differs from the registry's hash only for a schema with references (the registry hashes
// the references too), and it is what a Python producer or worker stamps for such a schema,
// so Resolver.ForEnvelope accepts either, as the Python SDK does. ok is false for protobuf
// (its canonical form is protoc's descriptors) and for a text that is not JSON.
func TextHash(kind, text string) (hash string, ok bool) {
	if kind != "avro" && kind != "json" || jsonDepth(text) > MaxDepth {
		return "", false
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return "", false
	}
	var b bytes.Buffer
	if !pyJSON(&b, v) {
		return "", false
	}
	sum := sha256.Sum256(b.Bytes())
	return "sha256:" + hex.EncodeToString(sum[:]), true
}

// pyJSON writes v as Python's json.dumps(sort_keys=True, separators=(",", ":"),
// ensure_ascii=False) would.
func pyJSON(b *bytes.Buffer, v any) bool {
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case string:
		pyString(b, x)
	case json.Number:
		s, ok := pyNumber(string(x))
		if !ok {
			return false
		}
		b.WriteString(s)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteByte(',')
			}
			if !pyJSON(b, e) {
				return false
			}
		}
		b.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys) // Python sorts str keys by code point; Go's byte order of UTF-8 is the same
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteByte(',')
			}
			pyString(b, k)
			b.WriteByte(':')
			if !pyJSON(b, x[k]) {
				return false
			}
		}
		b.WriteByte('}')
	default:
		return false
	}
	return true
}

func pyString(b *bytes.Buffer, s string) {
	b.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			if r < 0x20 {
				b.WriteString(`\u00`)
				b.WriteString(strconv.FormatInt(int64(r)>>4, 16))
				b.WriteString(strconv.FormatInt(int64(r)&15, 16))
			} else {
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

// pyNumber is a JSON number as Python reads and writes it: an integer (no fraction or
// exponent) in full, anything else as a float in Python's repr.
func pyNumber(n string) (string, bool) {
	if !strings.ContainsAny(n, ".eE") {
		i, ok := new(big.Int).SetString(n, 10)
		if !ok {
			return "", false
		}
		return i.String(), true
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil && !math.IsInf(f, 0) {
		return "", false
	}
	if math.IsInf(f, 0) {
		if f > 0 {
			return "Infinity", true
		}
		return "-Infinity", true
	}
	// repr: the shortest digits that round-trip; scientific when the exponent is < -4 or >= 16
	e := strconv.FormatFloat(f, 'e', -1, 64) // d.ddde±XX
	mant, expS, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expS)
	if exp < -4 || exp >= 16 {
		sign := "+"
		if exp < 0 {
			sign, exp = "-", -exp
		}
		es := strconv.Itoa(exp)
		if len(es) < 2 {
			es = "0" + es
		}
		return mant + "e" + sign + es, true
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(s, ".") {
		s += ".0"
	}
	return s, true
}
