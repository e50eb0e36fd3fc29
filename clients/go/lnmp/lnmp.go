// Package lnmp reads and writes LNMP messages (LNMP Envelope Specification v1.0, strict
// mode) and maps them to and from Prism envelopes, as the Python worker does
// (app/formats/lnmp.py, app/formats/lnmp_envelope.py, docs/formats.md):
//
//   - a binary container: "LNMP" | version 0x01 | mode | flags u16 BE | metadata_length u32 BE,
//     the metadata (fixed mode metadata, then a TLV chain when flags bit 15 is set), the record;
//   - a text message: an optional first line "#ENVELOPE timestamp=… source=… trace_id=… sequence=…";
//   - a bare record (neither).
//
// Loose-mode recovery of damaged containers is the Python worker's only. Every refusal is a
// *prismerr.Error with code bad_lnmp.
package lnmp

import (
	"encoding/binary"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/prism-envelope/prism/clients/go/prismerr"
)

// Container constants.
const (
	Magic            = "LNMP"
	ContainerVersion = 0x01
	HeaderLen        = 12
	FlagChecksum     = 0x0001
	FlagExtMetadata  = 0x8000
	knownFlags       = FlagChecksum | FlagExtMetadata
	ModeBinary       = 0x02
	TextKeyword      = "#ENVELOPE"
)

// TLV types of the envelope entries.
const (
	TLVTimestamp = 0x10
	TLVSource    = 0x11
	TLVTraceID   = 0x12
	TLVSequence  = 0x13
)

var modeMetadataLength = map[byte]int{0x03: 6, 0x04: 10}

func knownMode(m byte) bool { return m >= 0x01 && m <= 0x05 }

func bad(what, path, hint string) error { return prismerr.New("bad_lnmp", what, hint).At(path) }

// TLV is one TLV entry this implementation does not interpret (kept verbatim).
type TLV struct {
	Type  byte
	Value []byte
}

// Envelope is the LNMP envelope metadata; nil fields are absent.
type Envelope struct {
	Timestamp *uint64
	Source    *string
	TraceID   *string
	Sequence  *uint64
	ExtraTLV  []TLV       // ascending type
	ExtraKeys [][2]string // sorted by key
}

// Empty reports an envelope without any entry.
func (e *Envelope) Empty() bool {
	return e == nil || e.Timestamp == nil && e.Source == nil && e.TraceID == nil && e.Sequence == nil && len(e.ExtraTLV) == 0 && len(e.ExtraKeys) == 0
}

// Container is a decoded binary container; Record is a sub-slice of the input.
type Container struct {
	Record       []byte
	Envelope     *Envelope // nil without bit 15
	Mode         byte
	Flags        uint16 // without bit 15
	ModeMetadata []byte // fixed mode metadata, or the whole opaque metadata without bit 15
}

// IsContainer: magic, version 0x01 and a known mode, at least 12 bytes.
func IsContainer(data []byte) bool {
	return len(data) >= HeaderLen && string(data[:4]) == Magic && data[4] == ContainerVersion && knownMode(data[5])
}

// DecodeTLV parses a TLV chain strictly: ascending types, each at most once, 8-byte
// timestamp and sequence, UTF-8 strings, unknown types kept.
func DecodeTLV(block []byte) (*Envelope, error) {
	env := &Envelope{}
	pos, last := 0, -1
	for pos < len(block) {
		at := "metadata byte " + strconv.Itoa(pos)
		if len(block)-pos < 3 {
			return nil, bad("TLV header truncated: "+strconv.Itoa(len(block)-pos)+" byte(s) left, 3 needed", at, "metadata_length must cover whole TLV entries")
		}
		t := int(block[pos])
		length := int(binary.BigEndian.Uint16(block[pos+1:]))
		start := pos + 3
		if length > len(block)-start {
			return nil, bad("TLV claims more bytes than remain", at, "the metadata block is truncated or corrupted")
		}
		if t == last {
			return nil, bad("TLV type appears twice", at, "each type may appear at most once (spec 4.2 rule 2)")
		}
		if t < last {
			return nil, bad("TLV types out of order", at, "entries must be in ascending type order (spec 4.2 rule 1)")
		}
		last = t
		value := block[start : start+length]
		switch t {
		case TLVTimestamp, TLVSequence:
			if length != 8 {
				return nil, bad("timestamp/sequence TLV must be 8 bytes", at, "encode it as a u64 big-endian")
			}
			v := binary.BigEndian.Uint64(value)
			if t == TLVTimestamp {
				env.Timestamp = &v
			} else {
				env.Sequence = &v
			}
		case TLVSource, TLVTraceID:
			if !utf8.Valid(value) {
				return nil, bad("source/trace_id TLV is not valid UTF-8", at, "it is a UTF-8 string")
			}
			s := string(value)
			if t == TLVSource {
				env.Source = &s
			} else {
				env.TraceID = &s
			}
		default:
			env.ExtraTLV = append(env.ExtraTLV, TLV{byte(t), append([]byte(nil), value...)})
		}
		pos = start + length
	}
	return env, nil
}

// EncodeTLV is the canonical TLV chain of env (ascending types).
func EncodeTLV(env *Envelope) ([]byte, error) {
	type entry struct {
		t byte
		v []byte
	}
	var entries []entry
	u64 := func(v uint64) []byte { b := make([]byte, 8); binary.BigEndian.PutUint64(b, v); return b }
	if env.Timestamp != nil {
		entries = append(entries, entry{TLVTimestamp, u64(*env.Timestamp)})
	}
	if env.Source != nil {
		entries = append(entries, entry{TLVSource, []byte(*env.Source)})
	}
	if env.TraceID != nil {
		entries = append(entries, entry{TLVTraceID, []byte(*env.TraceID)})
	}
	if env.Sequence != nil {
		entries = append(entries, entry{TLVSequence, u64(*env.Sequence)})
	}
	seen := map[byte]bool{}
	for _, e := range entries {
		seen[e.t] = true
	}
	for _, x := range env.ExtraTLV {
		if seen[x.Type] || (x.Type >= TLVTimestamp && x.Type <= TLVSequence) {
			return nil, bad("TLV type given twice", "extra_tlv", "each type appears at most once; known types belong in their fields")
		}
		seen[x.Type] = true
		entries = append(entries, entry{x.Type, x.Value})
	}
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].t < entries[j].t })
	var out []byte
	for _, e := range entries {
		if len(e.v) > 0xffff {
			return nil, bad("TLV value over 65535 bytes", "extra_tlv", "")
		}
		out = append(out, e.t, byte(len(e.v)>>8), byte(len(e.v)))
		out = append(out, e.v...)
	}
	return out, nil
}

// DecodeContainer parses a container strictly; the record is a sub-slice of data.
func DecodeContainer(data []byte) (*Container, error) {
	if len(data) < HeaderLen {
		return nil, bad("LNMP container is shorter than its 12-byte header", "byte 0", "the message was truncated")
	}
	if string(data[:4]) != Magic {
		return nil, bad("not an LNMP container: magic is not 'LNMP'", "byte 0", "")
	}
	if data[4] != ContainerVersion {
		return nil, bad("unsupported LNMP container version", "byte 4", "this reader supports container version 0x01")
	}
	mode := data[5]
	if !knownMode(mode) {
		return nil, bad("unknown LNMP mode", "byte 5", "modes are 0x01-0x05")
	}
	flags := binary.BigEndian.Uint16(data[6:])
	mlen := uint64(binary.BigEndian.Uint32(data[8:]))
	if mlen > uint64(len(data)-HeaderLen) {
		return nil, bad("metadata_length runs past the end", "byte 8", "the message was truncated or metadata_length is wrong")
	}
	if flags&^knownFlags != 0 {
		return nil, bad("reserved container flag bits are set", "byte 6", "only bit 0 (checksum) and bit 15 (has_ext_metadata) are defined")
	}
	block := data[HeaderLen : HeaderLen+int(mlen)]
	c := &Container{Record: data[HeaderLen+int(mlen):], Mode: mode, Flags: flags &^ FlagExtMetadata, ModeMetadata: append([]byte{}, block...)}
	if flags&FlagExtMetadata != 0 {
		fixed := modeMetadataLength[mode]
		if int(mlen) < fixed {
			return nil, bad("metadata_length is shorter than the mode's fixed metadata", "byte 8", "the TLV chain follows the fixed mode metadata")
		}
		c.ModeMetadata = append([]byte{}, block[:fixed]...)
		env, err := DecodeTLV(block[fixed:])
		if err != nil {
			return nil, err
		}
		c.Envelope = env
	}
	return c, nil
}

// EncodeContainer serializes canonically: bit 15 and the TLV chain only when the envelope
// has entries.
func EncodeContainer(c *Container) ([]byte, error) {
	if c.Flags&FlagExtMetadata != 0 {
		return nil, bad("flags must not carry bit 15", "flags", "bit 15 (has_ext_metadata) is derived from the envelope")
	}
	var tlv []byte
	if c.Envelope != nil {
		var err error
		if tlv, err = EncodeTLV(c.Envelope); err != nil {
			return nil, err
		}
	}
	flags := c.Flags
	if len(tlv) > 0 {
		flags |= FlagExtMetadata
		if len(c.ModeMetadata) != modeMetadataLength[c.Mode] {
			return nil, bad("the mode needs its fixed metadata before the TLV chain", "mode_metadata", "Stream takes 6 bytes, Delta 10, other modes none")
		}
	}
	meta := append(append([]byte{}, c.ModeMetadata...), tlv...)
	out := []byte(Magic)
	out = append(out, ContainerVersion, c.Mode, byte(flags>>8), byte(flags))
	out = binary.BigEndian.AppendUint32(out, uint32(len(meta)))
	out = append(out, meta...)
	return append(out, c.Record...), nil
}

// ---------------------------------------------------------------- text

// HasTextHeader: the first line is an #ENVELOPE header (not e.g. an #ENVELOPES comment).
func HasTextHeader(data []byte) bool {
	if len(data) < len(TextKeyword) || string(data[:len(TextKeyword)]) != TextKeyword {
		return false
	}
	if len(data) == len(TextKeyword) {
		return true
	}
	switch data[len(TextKeyword)] {
	case ' ', '\n', '\r':
		return true
	}
	return false
}

// TextMessage is a text message: an optional envelope and the record after the header line.
type TextMessage struct {
	Envelope *Envelope
	Record   []byte
}

// DecodeText splits an optional #ENVELOPE first line from the record.
func DecodeText(data []byte) (*TextMessage, error) {
	if !HasTextHeader(data) {
		return &TextMessage{Record: data}, nil
	}
	line, record := data, data[len(data):]
	if nl := strings.IndexByte(string(data), '\n'); nl >= 0 {
		line, record = data[:nl], data[nl+1:]
	}
	if !utf8.Valid(line) {
		return nil, bad("#ENVELOPE line is not valid UTF-8", "line 1", "write the header as UTF-8 text")
	}
	text := strings.TrimSuffix(string(line), "\r")
	env, err := ParseTextHeader(text)
	if err != nil {
		return nil, err
	}
	return &TextMessage{Envelope: env, Record: record}, nil
}

var textKeys = map[string]bool{"timestamp": true, "source": true, "trace_id": true, "sequence": true}

// ParseTextHeader parses one #ENVELOPE line strictly (no newline).
func ParseTextHeader(line string) (*Envelope, error) {
	rest := strings.TrimPrefix(line, TextKeyword)
	if !strings.HasPrefix(line, TextKeyword) || (rest != "" && rest[0] != ' ') {
		return nil, bad("line does not start with '#ENVELOPE '", "line 1", "")
	}
	pairs, err := tokenize(rest)
	if err != nil {
		return nil, err
	}
	env := &Envelope{}
	seen := map[string]bool{}
	var extra [][2]string
	for _, p := range pairs {
		key, value := p[0], p[1]
		if key == "" {
			return nil, bad("#ENVELOPE has a pair with an empty key", "#ENVELOPE", "write key=value with a non-empty key")
		}
		if seen[key] {
			return nil, bad("#ENVELOPE key "+strconv.Quote(key)+" appears twice", "#ENVELOPE "+key, "give each key once")
		}
		seen[key] = true
		v := value
		switch key {
		case "timestamp", "sequence":
			n, err := u64Text(key, value)
			if err != nil {
				return nil, err
			}
			if key == "timestamp" {
				env.Timestamp = &n
			} else {
				env.Sequence = &n
			}
		case "source":
			env.Source = &v
		case "trace_id":
			env.TraceID = &v
		default:
			extra = append(extra, [2]string{key, value})
		}
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i][0] < extra[j][0] })
	env.ExtraKeys = extra
	return env, nil
}

func u64Text(key, value string) (uint64, error) {
	if value == "" || strings.Trim(value, "0123456789") != "" {
		return 0, bad("#ENVELOPE "+key+" is not an unsigned 64-bit decimal", "#ENVELOPE "+key, "write "+key+" as digits only")
	}
	n, err := strconv.ParseUint(value, 10, 64)
	if err != nil {
		return 0, bad("#ENVELOPE "+key+" is not an unsigned 64-bit decimal", "#ENVELOPE "+key, "write "+key+" as digits only")
	}
	return n, nil
}

func tokenize(body string) ([][2]string, error) {
	var pairs [][2]string
	i, n := 0, len(body)
	for {
		for i < n && body[i] == ' ' {
			i++
		}
		if i >= n {
			return pairs, nil
		}
		eq := strings.IndexByte(body[i:], '=')
		sp := strings.IndexByte(body[i:], ' ')
		if eq < 0 || (sp >= 0 && sp < eq) {
			return nil, bad("#ENVELOPE token has no '='", "#ENVELOPE char "+strconv.Itoa(i), "write key=value pairs separated by spaces")
		}
		eq += i
		key := body[i:eq]
		if strings.Contains(key, `"`) {
			return nil, bad("#ENVELOPE key contains a quote", "#ENVELOPE char "+strconv.Itoa(i), "keys are bare words; only values may be quoted")
		}
		i = eq + 1
		var value string
		if i < n && body[i] == '"' {
			var b strings.Builder
			i++
			for {
				if i >= n {
					return nil, bad("unterminated quoted value for "+strconv.Quote(key), "#ENVELOPE char "+strconv.Itoa(eq+1), "close the value with a double quote")
				}
				c := body[i]
				if c == '\\' {
					if i+1 >= n || (body[i+1] != '\\' && body[i+1] != '"') {
						return nil, bad("bad escape in the value of "+strconv.Quote(key), "#ENVELOPE char "+strconv.Itoa(i), `only \\ and \" are escapes in #ENVELOPE values`)
					}
					b.WriteByte(body[i+1])
					i += 2
				} else if c == '"' {
					i++
					break
				} else {
					b.WriteByte(c)
					i++
				}
			}
			if i < n && body[i] != ' ' {
				return nil, bad("text after the closing quote of "+strconv.Quote(key), "#ENVELOPE char "+strconv.Itoa(i), "separate pairs with a space")
			}
			value = b.String()
		} else {
			end := strings.IndexByte(body[i:], ' ')
			if end < 0 {
				end = n
			} else {
				end += i
			}
			value = body[i:end]
			i = end
		}
		pairs = append(pairs, [2]string{key, value})
	}
}

func quoteValue(v string) string {
	if !strings.Contains(v, " ") && !strings.HasPrefix(v, `"`) {
		return v
	}
	return `"` + strings.ReplaceAll(strings.ReplaceAll(v, `\`, `\\`), `"`, `\"`) + `"`
}

func checkLine(name, v string) error {
	if strings.ContainsAny(v, "\r\n") {
		return bad(name+" contains a line break", name, "the #ENVELOPE header is one line; remove CR/LF from the value")
	}
	return nil
}

// EncodeTextHeader is the canonical #ENVELOPE line (no newline); "" when env is empty.
func EncodeTextHeader(env *Envelope) (string, error) {
	if env.Empty() {
		return "", nil
	}
	parts := []string{TextKeyword}
	if env.Timestamp != nil {
		parts = append(parts, "timestamp="+strconv.FormatUint(*env.Timestamp, 10))
	}
	if env.Source != nil {
		if err := checkLine("source", *env.Source); err != nil {
			return "", err
		}
		parts = append(parts, "source="+quoteValue(*env.Source))
	}
	if env.TraceID != nil {
		if err := checkLine("trace_id", *env.TraceID); err != nil {
			return "", err
		}
		parts = append(parts, "trace_id="+quoteValue(*env.TraceID))
	}
	if env.Sequence != nil {
		parts = append(parts, "sequence="+strconv.FormatUint(*env.Sequence, 10))
	}
	extra := append([][2]string{}, env.ExtraKeys...)
	sort.Slice(extra, func(i, j int) bool { return extra[i][0] < extra[j][0] })
	seen := map[string]bool{}
	for _, kv := range extra {
		k, v := kv[0], kv[1]
		if k == "" || strings.ContainsAny(k, " =\"\r\n") || textKeys[k] || seen[k] {
			return "", bad("extra key is empty, duplicated, known, or has a space, '=', quote or line break", "extra_keys", "extra keys are bare words, each once")
		}
		seen[k] = true
		if err := checkLine(k, v); err != nil {
			return "", err
		}
		parts = append(parts, k+"="+quoteValue(v))
	}
	return strings.Join(parts, " "), nil
}

// EncodeText is the header line, a newline and the record; the record alone without metadata.
func EncodeText(record []byte, env *Envelope) ([]byte, error) {
	h, err := EncodeTextHeader(env)
	if err != nil || h == "" {
		return record, err
	}
	return append(append([]byte(h), '\n'), record...), nil
}
