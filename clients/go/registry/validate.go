package registry

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

var printer = message.NewPrinter(language.English)

// Violation is one way a payload does not match its schema.
type Violation struct {
	Path    string // JSONPath-style: $.items[2].price
	Message string
}

// ValidationError is a schema_validation_failed error with every violation (errors.As).
type ValidationError struct {
	Err        *prismerr.Error
	Violations []Violation
}

func (e *ValidationError) Error() string { return e.Err.Error() }

// Unwrap gives the *prismerr.Error (code schema_validation_failed) to errors.Is/As.
func (e *ValidationError) Unwrap() error { return e.Err }

// Validate checks a JSON payload against the schema (JSON Schema, Avro JSON datums, the
// protobuf JSON mapping); ValidateAs reads other content types.
func (s *Schema) Validate(payload []byte) error { return s.ValidateAs(payload, "application/json") }

// ValidateAs checks a payload of a content type, as the Python SDK's payload check does
// (app/schema/payload_check.py): protobuf schemas read the wire format, or the protobuf JSON
// mapping when the content type names JSON; Avro schemas read a binary datum, or a JSON
// document when the content type names JSON; JSON Schema reads JSON.
func (s *Schema) ValidateAs(payload []byte, contentType string) error {
	if s.Kind() == "protobuf" {
		return s.validateProto(payload, contentType)
	}
	if s.Kind() == "avro" {
		text, err := s.text()
		if err != nil {
			return err
		}
		if strings.Contains(strings.ToLower(contentType), "json") {
			return validateAvroJSON(text, payload)
		}
		return validateAvroBinary(text, payload)
	}
	if s.Kind() != "json" {
		return prismerr.New("payload_error", "validation of "+s.Kind()+" schemas is not implemented in the Go client",
			"validate with the Python SDK, or use a JSON Schema or Avro subject").At("schema")
	}
	compiled, err := s.compiled()
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &ValidationError{Err: prismerr.New("schema_validation_failed", "payload is not valid JSON: "+err.Error(), "").At("$"),
			Violations: []Violation{{"$", "not valid JSON"}}}
	}
	err = compiled.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return prismerr.New("schema_validation_failed", err.Error(), "").At("$")
	}
	var vs []Violation
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			vs = append(vs, Violation{Path: jsonPath(e.InstanceLocation), Message: e.ErrorKind.LocalizedString(printer)})
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	if len(vs) == 0 {
		vs = []Violation{{Path: "$", Message: ve.Error()}}
	}
	sort.SliceStable(vs, func(i, j int) bool { return vs[i].Path < vs[j].Path })
	return &ValidationError{Err: prismerr.New("schema_validation_failed",
		"payload does not match schema "+quote(s.Subject)+" version "+strconv.Itoa(s.Version)+": "+vs[0].Path+" "+vs[0].Message,
		"fix the payload, or publish against another schema version").At(vs[0].Path), Violations: vs}
}

func jsonPath(loc []string) string {
	var b strings.Builder
	b.WriteString("$")
	for _, p := range loc {
		if _, err := strconv.Atoi(p); err == nil {
			b.WriteString("[" + p + "]")
		} else {
			b.WriteString("." + p)
		}
	}
	return b.String()
}

var compileMu sync.Mutex
var compiledCache = map[string]*jsonschema.Schema{}

func (s *Schema) compiled() (*jsonschema.Schema, error) {
	text, err := s.text()
	if err != nil {
		return nil, err
	}
	compileMu.Lock()
	defer compileMu.Unlock()
	if c, ok := compiledCache[text]; ok {
		return c, nil
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, prismerr.New("payload_error", "the registry's JSON Schema is not JSON: "+err.Error(), "").At("schema")
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("prism:schema.json", doc); err != nil {
		return nil, prismerr.New("payload_error", "the registry's JSON Schema does not load: "+err.Error(), "").At("schema")
	}
	compiled, err := c.Compile("prism:schema.json")
	if err != nil {
		return nil, prismerr.New("payload_error", "the registry's JSON Schema does not compile: "+err.Error(), "").At("schema")
	}
	if len(compiledCache) > 256 {
		compiledCache = map[string]*jsonschema.Schema{}
	}
	compiledCache[text] = compiled
	return compiled, nil
}

// Validator validates every published envelope against the version of the subject named
// like its topic (RFC-030 Workflow 1) and stamps the envelope's schema context with that
// version. Plug it into kafka.Config.Validator. Version "" means latest (looked up per
// publish; pin a number for a stable contract).
type Validator struct {
	Client  *Client
	Version string

	mu    sync.Mutex
	cache map[string]*Schema
}

// ValidateEnvelope validates env's payload (before encryption) and fills its schema context.
func (v *Validator) ValidateEnvelope(ctx context.Context, topic string, env *envelope.Envelope) error {
	version := v.Version
	if version == "" {
		version = "latest"
	}
	key := topic + "\x00" + version
	v.mu.Lock()
	s := v.cache[key]
	v.mu.Unlock()
	if s == nil || version == "latest" {
		var err error
		if s, err = v.Client.PrismVersion(ctx, topic, version); err != nil {
			return err
		}
		if version != "latest" {
			v.mu.Lock()
			if v.cache == nil {
				v.cache = map[string]*Schema{}
			}
			v.cache[key] = s
			v.mu.Unlock()
		}
	}
	payload, err := env.PayloadBytes()
	if err != nil {
		return err
	}
	if err := s.ValidateAs(payload, envelope.ContentType(env.Header.GetMetadata())); err != nil {
		return err
	}
	sc := env.Header.Schema
	if sc == nil {
		sc = &reviewedpb.SchemaContext{}
		env.Header.Schema = sc
	}
	sc.SchemaUrl, sc.SchemaVersion, sc.SchemaFormat, sc.SchemaHash = s.URL, strconv.Itoa(s.Version), s.Kind(), s.Hash
	if sc.SchemaName == "" {
		sc.SchemaName = s.Subject
	}
	if pii, _ := s.PIIPaths(); len(pii) > 0 && (env.Header.Security == nil || env.Header.Security.ContainsPii == nil) {
		t := true
		env.EnsureSecurity().ContainsPii = &t
	}
	return nil
}
