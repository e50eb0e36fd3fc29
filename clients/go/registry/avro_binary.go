package registry

import (
	"encoding/binary"
	"math"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/hamba/avro/v2"
	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Binary Avro payloads (the schemaless datum encoding Confluent's and Prism's producers
// write: no container header, no magic byte). The schema is parsed by hamba/avro (names,
// namespaces, references already inlined); the datum is read by the bounded reader below,
// not by hamba's reflection decoder, so that a hostile payload meets explicit limits: every
// length is checked against the bytes left before anything is allocated, nesting stops at
// MaxDepth (a recursive schema cannot turn 16 MiB of payload into 16 million stack frames),
// and strings must be UTF-8 (as fastavro, which the Python SDK uses, decodes them).
//
// The decoded value is what encoding/json produces for the same data, so MaskPII works on
// it: records and maps are map[string]any, arrays []any, int/long int64 (int32 for int),
// float float32, double float64, bytes and fixed []byte, enums their symbol, null nil;
// a union is its branch's value (as fastavro returns it).

var avroSchemas = struct {
	sync.Mutex
	m map[string]avro.Schema
}{m: map[string]avro.Schema{}}

// avroSchema parses the self-contained schema text (cached by text).
func avroSchema(text string) (avro.Schema, error) {
	avroSchemas.Lock()
	sc, ok := avroSchemas.m[text]
	avroSchemas.Unlock()
	if ok {
		return sc, nil
	}
	if d := jsonDepth(text); d > MaxDepth {
		return nil, prismerr.New("payload_error", "the registry's Avro schema nests "+strconv.Itoa(d)+" deep, more than "+strconv.Itoa(MaxDepth), "").At("schema")
	}
	// A fresh name cache per schema: hamba's default cache is global, and two schemas that
	// define one name differently must not see each other's definition.
	sc, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, prismerr.New("payload_error", "the registry's Avro schema does not parse: "+err.Error(), "").At("schema")
	}
	avroSchemas.Lock()
	if len(avroSchemas.m) > 256 {
		avroSchemas.m = map[string]avro.Schema{}
	}
	avroSchemas.m[text] = sc
	avroSchemas.Unlock()
	return sc, nil
}

type avroReader struct {
	buf   []byte
	pos   int
	steps int // values read so far (the step budget: len(buf) + maxFreeValues)
}

type avroErr struct{ what string }

func (e *avroErr) Error() string { return e.what }

func (r *avroReader) fail(what string) error {
	return &avroErr{what + " at byte " + strconv.Itoa(r.pos)}
}

func (r *avroReader) long() (int64, error) {
	u, n := binary.Uvarint(r.buf[r.pos:])
	if n <= 0 {
		return 0, r.fail("truncated or overlong varint")
	}
	r.pos += n
	return int64(u>>1) ^ -int64(u&1), nil
}

func (r *avroReader) take(n int64) ([]byte, error) {
	if n < 0 || n > int64(len(r.buf)-r.pos) {
		return nil, r.fail("length " + strconv.FormatInt(n, 10) + " exceeds the bytes left")
	}
	b := r.buf[r.pos : r.pos+int(n)]
	r.pos += int(n)
	return b, nil
}

// blockCount reads one block header of an array or map: a count (negative: followed by the
// block's byte size, which is read and ignored). The items are bounded by the reader's step
// budget, not by the count (items of a zero-byte type, null or an empty record, cost nothing).
func (r *avroReader) blockCount() (int64, error) {
	n, err := r.long()
	if err != nil {
		return 0, err
	}
	if n < 0 {
		if n == math.MinInt64 {
			return 0, r.fail("block count out of range")
		}
		n = -n
		if _, err := r.long(); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// maxFreeValues bounds the values a datum may hold beyond one per payload byte (values of a
// zero-byte type), so a short hostile payload cannot describe an unbounded array of nulls.
const maxFreeValues = 1 << 16

func (r *avroReader) read(s avro.Schema, depth int) (any, error) {
	if depth > MaxDepth {
		return nil, r.fail("datum nests more than " + strconv.Itoa(MaxDepth) + " deep")
	}
	if r.steps++; r.steps > len(r.buf)+maxFreeValues {
		return nil, r.fail("datum holds more values than its bytes allow")
	}
	switch s.Type() {
	case avro.Null:
		return nil, nil
	case avro.Boolean:
		b, err := r.take(1)
		if err != nil {
			return nil, err
		}
		if b[0] > 1 {
			return nil, r.fail("boolean byte is not 0 or 1")
		}
		return b[0] == 1, nil
	case avro.Int:
		v, err := r.long()
		if err != nil {
			return nil, err
		}
		if v < math.MinInt32 || v > math.MaxInt32 {
			return nil, r.fail("int out of range")
		}
		return int32(v), nil
	case avro.Long:
		return r.long()
	case avro.Float:
		b, err := r.take(4)
		if err != nil {
			return nil, err
		}
		return math.Float32frombits(binary.LittleEndian.Uint32(b)), nil
	case avro.Double:
		b, err := r.take(8)
		if err != nil {
			return nil, err
		}
		return math.Float64frombits(binary.LittleEndian.Uint64(b)), nil
	case avro.Bytes, avro.String:
		n, err := r.long()
		if err != nil {
			return nil, err
		}
		b, err := r.take(n)
		if err != nil {
			return nil, err
		}
		if s.Type() == avro.String {
			if !utf8.Valid(b) {
				return nil, r.fail("string is not UTF-8")
			}
			return string(b), nil
		}
		return append([]byte(nil), b...), nil
	case avro.Fixed:
		b, err := r.take(int64(s.(*avro.FixedSchema).Size()))
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), b...), nil
	case avro.Enum:
		i, err := r.long()
		if err != nil {
			return nil, err
		}
		syms := s.(*avro.EnumSchema).Symbols()
		if i < 0 || i >= int64(len(syms)) {
			return nil, r.fail("enum index " + strconv.FormatInt(i, 10) + " out of range")
		}
		return syms[i], nil
	case avro.Union:
		i, err := r.long()
		if err != nil {
			return nil, err
		}
		branches := s.(*avro.UnionSchema).Types()
		if i < 0 || i >= int64(len(branches)) {
			return nil, r.fail("union branch " + strconv.FormatInt(i, 10) + " out of range")
		}
		return r.read(branches[i], depth+1)
	case avro.Array:
		items := s.(*avro.ArraySchema).Items()
		out := []any{}
		for {
			n, err := r.blockCount()
			if err != nil {
				return nil, err
			}
			if n == 0 {
				return out, nil
			}
			for ; n > 0; n-- {
				v, err := r.read(items, depth+1)
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
		}
	case avro.Map:
		values := s.(*avro.MapSchema).Values()
		out := map[string]any{}
		for {
			n, err := r.blockCount()
			if err != nil {
				return nil, err
			}
			if n == 0 {
				return out, nil
			}
			for ; n > 0; n-- {
				kl, err := r.long()
				if err != nil {
					return nil, err
				}
				kb, err := r.take(kl)
				if err != nil {
					return nil, err
				}
				if !utf8.Valid(kb) {
					return nil, r.fail("map key is not UTF-8")
				}
				v, err := r.read(values, depth+1)
				if err != nil {
					return nil, err
				}
				out[string(kb)] = v
			}
		}
	case avro.Record, avro.Error:
		fields := s.(*avro.RecordSchema).Fields()
		out := make(map[string]any, len(fields))
		for _, f := range fields {
			v, err := r.read(f.Type(), depth+1)
			if err != nil {
				return nil, err
			}
			out[f.Name()] = v
		}
		return out, nil
	case avro.Ref:
		return r.read(s.(*avro.RefSchema).Schema(), depth+1)
	}
	return nil, r.fail("unsupported Avro type " + string(s.Type()))
}

// decodeAvroBinary reads one datum; trailing reports the bytes after it (the Python SDK's
// decode refuses them; its validation, fastavro's schemaless_reader, ignores them).
func decodeAvroBinary(text string, payload []byte) (datum any, trailing int, err error) {
	sc, err := avroSchema(text)
	if err != nil {
		return nil, 0, err
	}
	r := &avroReader{buf: payload}
	datum, err = r.read(sc, 0)
	if err != nil {
		return nil, 0, err
	}
	return datum, len(payload) - r.pos, nil
}

func validateAvroBinary(text string, payload []byte) error {
	_, _, err := decodeAvroBinary(text, payload)
	if err == nil {
		return nil
	}
	if _, ok := err.(*avroErr); !ok {
		return err // the schema's own problem (payload_error)
	}
	return &ValidationError{Err: prismerr.New("schema_validation_failed", "payload is not binary Avro of this schema: "+err.Error(),
		"fix the payload, or publish against another schema version").At("$"),
		Violations: []Violation{{"$", "avro binary encoding: " + err.Error()}}}
}
