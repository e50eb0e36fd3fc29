package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/gen/reviewedpb"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/registry"
)

const profile = `{"type":"object","properties":{
 "user_id":{"type":"string","x-prism-pii":"none"},
 "contact":{"type":"object","properties":{"email":{"type":"string","x-prism-pii":"email"},"city":{"type":"string"}}},
 "cards":{"type":"array","items":{"type":"object","properties":{"pan":{"type":"string","x-prism-encrypt":"aes256"}}}},
 "self":{"$ref":"#"}}}`

// fake serves the registry routes the client uses, and hostile answers on other subjects.
func fake(t *testing.T) *registry.Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/subjects/users.profile/versions/1", "/v1/subjects/users.profile/versions/latest":
			_ = json.NewEncoder(w).Encode(map[string]any{"subject": "users.profile", "version": 1, "id": 7, "format": "JSON", "schema": profile, "hash": "sha256:aa"})
		case "/v1/schemas/7":
			_ = json.NewEncoder(w).Encode(map[string]any{"id": 7, "format": "JSON", "schema": profile, "hash": "sha256:aa"})
		case "/schemas/ids/7":
			_ = json.NewEncoder(w).Encode(map[string]any{"schemaType": "JSON", "schema": profile})
		case "/schemas/ids/7/versions":
			_, _ = w.Write([]byte(`[{"subject":"users.profile","version":1}]`))
		case "/v1/subjects/garbage/versions/1":
			_, _ = w.Write([]byte(`{"subject": [1,2`))
		case "/v1/subjects/huge/versions/1":
			_, _ = w.Write([]byte(`"` + strings.Repeat("x", 2<<20) + `"`))
		default:
			w.WriteHeader(404)
			_, _ = w.Write([]byte(`{"error_code":40401,"message":"Subject not found"}`))
		}
	}))
	t.Cleanup(srv.Close)
	c, err := registry.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c.MaxResponseBytes = 1 << 20
	return c
}

func env(t *testing.T, url, hash string) *envelope.Envelope {
	e, err := envelope.NewJSON("users.profile", "users", map[string]any{"user_id": "u", "contact": map[string]any{"email": "a@b", "city": "x"}}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.Header.Schema = &reviewedpb.SchemaContext{SchemaUrl: url, SchemaHash: hash}
	return e
}

func TestResolveChecksTheReference(t *testing.T) {
	c := fake(t)
	r := registry.NewResolver(c)
	ctx := context.Background()
	for _, url := range []string{"http://evil.example/v1/subjects/users.profile/versions/1", "/schemas/ids/7", "https://x/v1/schemas/7"} {
		s, err := r.ForEnvelope(ctx, env(t, url, "sha256:aa"))
		if err != nil || s.Subject != "users.profile" || s.Kind() != "json" {
			t.Fatalf("%s: %v %+v", url, err, s)
		}
	}
	for name, e := range map[string]*envelope.Envelope{
		"other subject": env(t, "/v1/subjects/other/versions/1", ""),
		"wrong hash":    env(t, "/v1/subjects/users.profile/versions/1", "sha256:bb"),
		"no reference":  env(t, "not a url", ""),
		"huge id":       env(t, "/schemas/ids/99999999999", ""),
		"unknown id":    env(t, "/schemas/ids/8", ""),
	} {
		if _, err := r.ForEnvelope(ctx, e); !errors.Is(err, prismerr.ErrSchemaReference) {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, subject := range []string{"garbage", "huge", "missing"} {
		_, err := c.PrismVersion(ctx, subject, "1")
		var re *registry.Error
		if !errors.Is(err, prismerr.ErrRegistry) || (subject == "missing" && (!errors.As(err, &re) || !re.NotFound())) {
			t.Errorf("%s: %v", subject, err)
		}
	}
}

func TestMaskAndValidate(t *testing.T) {
	s, err := fake(t).PrismVersion(context.Background(), "users.profile", "1")
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.MaskJSON([]byte(`{"user_id":"u","contact":{"email":"a@b","city":"x"},"cards":[{"pan":"4111"}],"self":{"contact":{"email":"c@d"}},"extra":{"email":"kept"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var got any
	_ = json.Unmarshal(out, &got)
	want := map[string]any{"user_id": "u", "contact": map[string]any{"email": "***", "city": "x"}, "cards": []any{map[string]any{"pan": "***"}},
		"self": map[string]any{"contact": map[string]any{"email": "***"}}, "extra": map[string]any{"email": "kept"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("masked %v", got)
	}
	if err := s.Validate([]byte(`{"contact":{"email":"a@b"}}`)); err != nil {
		t.Fatal(err)
	}
	err = s.Validate([]byte(`{"contact":{"email":5},"cards":[{"pan":1}]}`))
	var ve *registry.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, prismerr.ErrSchemaValidation) || len(ve.Violations) != 2 || ve.Violations[1].Path != "$.contact.email" {
		t.Fatalf("violations: %v %+v", err, ve)
	}
	if err := s.Validate([]byte(`{not json`)); !errors.Is(err, prismerr.ErrSchemaValidation) {
		t.Fatalf("not JSON: %v", err)
	}
	deep := strings.Repeat(`{"a":`, 200) + "1" + strings.Repeat("}", 200)
	if _, err := s.MaskJSON([]byte(deep)); err != nil {
		t.Fatalf("deep payload: %v", err)
	}
}

const avroProfile = `{"type":"record","name":"Profile","namespace":"users","fields":[
 {"name":"user_id","type":"string","prism.pii":"none"},
 {"name":"contact","type":{"type":"record","name":"Contact","fields":[{"name":"email","type":"string","prism.pii":"email"},{"name":"city","type":"string"}]}},
 {"name":"backup","type":["null","Contact"],"default":null},
 {"name":"phones","type":{"type":"map","values":"string"},"prism.pii":"phone"},
 {"name":"visits","type":"int"}]}`

// FuzzValidateAndMask: validating, decoding and masking any payload against JSON Schema,
// Avro (JSON and binary datums, a recursive schema) and protobuf schemas gives a verdict or
// a typed error, never a panic.
func FuzzValidateAndMask(f *testing.F) {
	f.Add([]byte(`{"user_id":"u","contact":{"email":"e","city":"c"},"phones":{},"visits":1}`))
	f.Add([]byte(`{"contact":{"email":5},"cards":[{"pan":1}],"self":{"self":{"self":{}}}}`))
	f.Add([]byte(`[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]`))
	f.Add([]byte(`{`))
	f.Add([]byte("\x02u\x02e\x02c\x02\x02\x02\x02h\x021\x00\x06")) // binary Avro of avroProfile
	f.Add([]byte{0x02, 0x02, 0x02, 0x00})                          // three nodes of the list below
	schemas := []*registry.Schema{{Text: profile, Format: "JSON"}, {Text: avroProfile, Format: "AVRO"},
		{Text: `{"type":"record","name":"L","fields":[{"name":"v","type":{"type":"array","items":"null"}},{"name":"next","type":["null","L"]}]}`, Format: "AVRO"},
		{Text: "syntax = \"proto3\";\nimport \"prism/annotations.proto\";\nmessage P { string email = 1 [(prism.pii) = \"email\"]; repeated P kids = 2; map<string, P> by = 3; }", Format: "PROTOBUF"}}
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, s := range schemas {
			_, perr := s.MaskProto(payload)
			if s.Kind() != "protobuf" {
				perr = nil
			}
			for _, err := range []error{s.Validate(payload), s.ValidateAs(payload, "application/protobuf"), perr,
				func() error { _, err := s.MaskJSON(payload); return err }(),
				func() error { _, err := s.Decode(payload, ""); return err }(),
				func() error { _, err := s.Decode(payload, "application/json"); return err }()} {
				var pe *prismerr.Error
				if err != nil && !errors.As(err, &pe) {
					t.Fatalf("untyped error: %v", err)
				}
			}
		}
	})
}
