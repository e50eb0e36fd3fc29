package registry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/hamba/avro/v2"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/registry"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

const avroBinProfile = `{"type":"record","name":"Profile","namespace":"users","fields":[
 {"name":"user_id","type":"string","prism.pii":"none"},
 {"name":"contact","type":{"type":"record","name":"Contact","fields":[
   {"name":"email","type":"string","prism.pii":"email"},{"name":"city","type":"string"}]}},
 {"name":"backup","type":["null","Contact"],"default":null},
 {"name":"phones","type":{"type":"map","values":"string"},"prism.pii":"phone"},
 {"name":"tags","type":{"type":"array","items":"string"}},
 {"name":"visits","type":"int"},
 {"name":"score","type":"double"},
 {"name":"kind","type":{"type":"enum","name":"Kind","symbols":["A","B"]}},
 {"name":"raw","type":"bytes"}]}`

type contact struct {
	Email string `avro:"email"`
	City  string `avro:"city"`
}

type binProfile struct {
	UserID  string            `avro:"user_id"`
	Contact contact           `avro:"contact"`
	Backup  *contact          `avro:"backup"`
	Phones  map[string]string `avro:"phones"`
	Tags    []string          `avro:"tags"`
	Visits  int32             `avro:"visits"`
	Score   float64           `avro:"score"`
	Kind    string            `avro:"kind"`
	Raw     []byte            `avro:"raw"`
}

// hamba/avro's encoder writes the payloads; the client's own bounded reader reads them (two
// implementations of the encoding meet).
func avroPayload(t testing.TB, v binProfile) []byte {
	t.Helper()
	b, err := avro.Marshal(avro.MustParse(avroBinProfile), v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBinaryAvroDecodesValidatesAndMasks(t *testing.T) {
	s := &registry.Schema{Subject: "users.avro", Version: 1, Format: "avro", Text: avroBinProfile}
	p := avroPayload(t, binProfile{UserID: "u-1", Contact: contact{"a@example.com", "Lyon"}, Backup: &contact{"b@example.com", "Nice"},
		Phones: map[string]string{"home": "+33"}, Tags: []string{"x", "y"}, Visits: 3, Score: 1.5, Kind: "B", Raw: []byte{0, 1}})
	if err := s.ValidateAs(p, "application/avro"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Decode(p, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"user_id": "u-1", "contact": map[string]any{"email": "a@example.com", "city": "Lyon"},
		"backup": map[string]any{"email": "b@example.com", "city": "Nice"}, "phones": map[string]any{"home": "+33"},
		"tags": []any{"x", "y"}, "visits": int32(3), "score": 1.5, "kind": "B", "raw": []byte{0, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %#v\nwant %#v", got, want)
	}
	masked, err := s.MaskPII(got)
	if err != nil {
		t.Fatal(err)
	}
	m := masked.(map[string]any)
	if m["phones"] != registry.Mask || m["contact"].(map[string]any)["email"] != registry.Mask || m["backup"].(map[string]any)["email"] != registry.Mask || m["user_id"] != "u-1" {
		t.Fatalf("masked %#v", m)
	}
	// a null union branch
	p2 := avroPayload(t, binProfile{UserID: "u", Kind: "A"})
	if d, err := s.Decode(p2, "application/octet-stream"); err != nil || d.(map[string]any)["backup"] != nil {
		t.Fatalf("%v %v", d, err)
	}
	// the JSON content type still reads a JSON datum
	if err := s.ValidateAs([]byte(`{"user_id":"u","contact":{"email":"e","city":"c"},"phones":{},"tags":[],"visits":1,"score":1,"kind":"A","raw":"x"}`), "application/json"); err == nil {
		t.Fatal("bytes written as JSON must not validate (as fastavro)")
	}
}

// TestBinaryAvroHostile: damaged and hostile datums are schema_validation_failed on
// validation and payload_error on decode - never a panic, a hang or a huge allocation.
func TestBinaryAvroHostile(t *testing.T) {
	s := &registry.Schema{Subject: "users.avro", Version: 1, Format: "avro", Text: avroBinProfile}
	good := avroPayload(t, binProfile{UserID: "u", Contact: contact{"e", "c"}, Tags: []string{"a"}, Kind: "A"})
	cases := map[string][]byte{
		"empty":            {},
		"truncated":        good[:len(good)-3],
		"huge string":      {0xfe, 0xff, 0xff, 0xff, 0x0f},
		"negative length":  {0x01},
		"overlong varint":  bytes.Repeat([]byte{0xff}, 11),
		"bad union branch": append([]byte{0x02, 'u', 0x02, 'e', 0x02, 'c'}, 0x08),
		"invalid utf-8":    {0x02, 0xff},
	}
	for name, p := range cases {
		var ve *registry.ValidationError
		if err := s.ValidateAs(p, ""); !errors.As(err, &ve) || !errors.Is(err, prismerr.ErrSchemaValidation) {
			t.Errorf("%s: validate %v", name, err)
		}
		if _, err := s.Decode(p, ""); !errors.Is(err, prismerr.ErrPayload) {
			t.Errorf("%s: decode %v", name, err)
		}
	}
	// trailing bytes: Python's validation (schemaless_reader) ignores them, its decode refuses them
	if err := s.ValidateAs(append(good, 0), ""); err != nil {
		t.Errorf("trailing: validate %v", err)
	}
	if _, err := s.Decode(append(good, 0), ""); !errors.Is(err, prismerr.ErrPayload) || !strings.Contains(err.Error(), "after the Avro datum") {
		t.Errorf("trailing: decode %v", err)
	}
	// a recursive schema cannot recurse without bound; an array of nulls cannot grow without bound
	list := &registry.Schema{Format: "avro", Text: `{"type":"record","name":"L","fields":[{"name":"next","type":["null","L"]}]}`}
	if _, err := list.Decode(bytes.Repeat([]byte{0x02}, 1<<20), ""); !errors.Is(err, prismerr.ErrPayload) || !strings.Contains(err.Error(), "deep") {
		t.Errorf("deep: %v", err)
	}
	nulls := &registry.Schema{Format: "avro", Text: `{"type":"array","items":"null"}`}
	bomb := bytes.Repeat([]byte{0xfe, 0xff, 0xff, 0xff, 0x0f}, 100) // 100 blocks of 2^31 nulls
	if _, err := nulls.Decode(bomb, ""); !errors.Is(err, prismerr.ErrPayload) {
		t.Errorf("null bomb: %v", err)
	}
	// a schema that does not parse is the schema's problem, not the payload's
	bad := &registry.Schema{Format: "avro", Text: `{"type":"record","name":"X","fields":[{"name":"a","type":"Nope"}]}`}
	if err := bad.ValidateAs([]byte{0}, ""); !errors.Is(err, prismerr.ErrPayload) || errors.Is(err, prismerr.ErrSchemaValidation) {
		t.Errorf("bad schema: %v", err)
	}
	deep := &registry.Schema{Format: "avro", Text: strings.Repeat(`{"type":"array","items":`, 3000) + `"int"` + strings.Repeat("}", 3000)}
	if err := deep.ValidateAs([]byte{0}, ""); !errors.Is(err, prismerr.ErrPayload) {
		t.Errorf("3000-deep schema: %v", err)
	}
}

// referencing registry: subjects whose schemas reference others (Confluent references).
const moneyProto = `syntax = "proto3";
package common.v1;
import "prism/annotations.proto";
message Money { string currency = 1; int64 units = 2; string owner = 3 [(prism.pii) = "name"]; }
`

const addressProto = `syntax = "proto3";
package common.v1;
import "prism/annotations.proto";
import "common/money.proto";
message Address { string street = 1 [(prism.pii) = "address"]; string city = 2; Money deposit = 3; }
`

const orderProto = `syntax = "proto3";
package shop.v1;
import "common/address.proto";
import "common/money.proto";
message Order { string id = 1; common.v1.Money total = 2; common.v1.Address ship_to = 3; }
`

const avroAddress = `{"type":"record","name":"Address","namespace":"common","fields":[
 {"name":"street","type":"string","prism.pii":"address"},{"name":"city","type":"string"}]}`

const avroOrder = `{"type":"record","name":"Order","namespace":"shop","fields":[
 {"name":"id","type":"string"},{"name":"ship_to","type":"common.Address"},{"name":"bill_to","type":["null","common.Address"]}]}`

const jsonAddress = `{"type":"object","properties":{"street":{"type":"string","x-prism-pii":"address"},"city":{"type":"string"}},"required":["city"]}`

const jsonOrder = `{"type":"object","properties":{"id":{"type":"string"},"ship_to":{"$ref":"address.json"}}}`

func referencing(t *testing.T) *registry.Client {
	t.Helper()
	versions := map[string]map[string]any{
		"common.money": {"subject": "common.money", "version": 1, "id": 1, "schemaType": "PROTOBUF", "schema": moneyProto},
		"common.address": {"subject": "common.address", "version": 1, "id": 2, "schemaType": "PROTOBUF", "schema": addressProto,
			"references": []any{map[string]any{"name": "common/money.proto", "subject": "common.money", "version": 1}}},
		"shop.orders": {"subject": "shop.orders", "version": 1, "id": 3, "schemaType": "PROTOBUF", "schema": orderProto,
			"references": []any{map[string]any{"name": "common/address.proto", "subject": "common.address", "version": 1},
				map[string]any{"name": "common/money.proto", "subject": "common.money", "version": 1}}},
		"avro.address": {"subject": "avro.address", "version": 1, "id": 4, "schema": avroAddress},
		"avro.orders": {"subject": "avro.orders", "version": 1, "id": 5, "schema": avroOrder,
			"references": []any{map[string]any{"name": "common.Address", "subject": "avro.address", "version": 1}}},
		"json.address": {"subject": "json.address", "version": 1, "id": 6, "schemaType": "JSON", "schema": jsonAddress},
		"json.orders": {"subject": "json.orders", "version": 1, "id": 7, "schemaType": "JSON", "schema": jsonOrder,
			"references": []any{map[string]any{"name": "address.json", "subject": "json.address", "version": 1}}},
		"loop": {"subject": "loop", "version": 1, "id": 8, "schemaType": "JSON", "schema": `{}`,
			"references": []any{map[string]any{"name": "x", "subject": "loop", "version": 1}}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for subject, v := range versions {
			for _, p := range []string{"/subjects/" + subject + "/versions/1", "/v1/subjects/" + subject + "/versions/1"} {
				if r.URL.Path == p {
					_ = json.NewEncoder(w).Encode(v)
					return
				}
			}
		}
		w.WriteHeader(404)
		_, _ = w.Write([]byte(`{"error_code":40401,"message":"Subject not found"}`))
	}))
	t.Cleanup(srv.Close)
	c, err := registry.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestProtobufSchemaWithImports(t *testing.T) {
	ctx := context.Background()
	c := referencing(t)
	s, err := c.PrismVersion(ctx, "shop.orders", "1")
	if err != nil {
		t.Fatal(err)
	}
	paths, err := s.PIIPaths()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(paths, []string{"shipTo.deposit.owner", "shipTo.street", "ship_to.deposit.owner", "ship_to.street", "total.owner"}) { // both spellings, as Python's pii_paths()
		t.Fatalf("pii paths %v", paths)
	}
	payload := []byte(`{"id":"o-1","total":{"currency":"EUR","units":"12","owner":"Jane"},"shipTo":{"street":"1 rue X","city":"Lyon","deposit":{"units":"3"}}}`)
	if err := s.ValidateAs(payload, "application/json"); err != nil {
		t.Fatal(err)
	}
	decoded, err := s.Decode(payload, "application/json")
	if err != nil {
		t.Fatal(err)
	}
	msg := decoded.(*dynamicpb.Message)
	if msg.Descriptor().FullName() != "shop.v1.Order" {
		t.Fatalf("root %s", msg.Descriptor().FullName())
	}
	if m, err := s.MaskPII(msg); err != nil || m.(*dynamicpb.Message).Get(m.(*dynamicpb.Message).Descriptor().Fields().ByName("total")).Message().Interface().(*dynamicpb.Message) == nil {
		t.Fatalf("MaskPII of a message: %v", err)
	} else if js, _ := protojson.Marshal(m.(proto.Message)); !strings.Contains(string(js), `"owner":"***"`) || strings.Contains(string(js), "Jane") {
		t.Fatalf("MaskPII of a message: %s", js)
	}
	if js, _ := protojson.Marshal(msg); !strings.Contains(string(js), "Jane") {
		t.Fatal("MaskPII changed its input")
	}
	wire, _ := proto.Marshal(msg)
	masked, err := s.MaskProto(wire)
	if err != nil {
		t.Fatal(err)
	}
	back, err := s.Decode(masked, "application/protobuf")
	if err != nil {
		t.Fatal(err)
	}
	js, _ := protojson.Marshal(back.(protoreflect.ProtoMessage))
	var got map[string]any
	_ = json.Unmarshal(js, &got)
	if got["total"].(map[string]any)["owner"] != registry.Mask || got["shipTo"].(map[string]any)["street"] != registry.Mask ||
		got["shipTo"].(map[string]any)["city"] != "Lyon" {
		t.Fatalf("masked %s", js)
	}
	if err := s.ValidateAs([]byte{0x12, 0xff}, "application/protobuf"); !errors.Is(err, prismerr.ErrSchemaValidation) {
		t.Fatalf("broken wire: %v", err)
	}
	// a schema whose references were not fetched says so
	bare := &registry.Schema{Format: "protobuf", Text: orderProto, References: s.References}
	if err := bare.ValidateAs(wire, ""); !errors.Is(err, prismerr.ErrPayload) || !strings.Contains(err.Error(), "not resolved") {
		t.Fatalf("unresolved: %v", err)
	}
	if err := c.ResolveReferences(ctx, bare); err != nil || bare.ValidateAs(wire, "") != nil {
		t.Fatalf("resolved by hand: %v", err)
	}
}

func TestAvroAndJSONSchemaReferences(t *testing.T) {
	ctx := context.Background()
	c := referencing(t)
	s, err := c.Version(ctx, "avro.orders", "1")
	if err != nil {
		t.Fatal(err)
	}
	type address struct {
		Street string `avro:"street"`
		City   string `avro:"city"`
	}
	type order struct {
		ID     string   `avro:"id"`
		ShipTo address  `avro:"ship_to"`
		BillTo *address `avro:"bill_to"`
	}
	expanded := `{"type":"record","name":"Order","namespace":"shop","fields":[{"name":"id","type":"string"},
	 {"name":"ship_to","type":` + avroAddress + `},{"name":"bill_to","type":["null","common.Address"]}]}`
	wire, err := avro.Marshal(avro.MustParse(expanded), order{"o-1", address{"1 rue X", "Lyon"}, &address{"2 rue Y", "Nice"}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := s.Decode(wire, "")
	if err != nil {
		t.Fatal(err)
	}
	if d.(map[string]any)["bill_to"].(map[string]any)["city"] != "Nice" {
		t.Fatalf("decoded %v", d)
	}
	if paths, _ := s.PIIPaths(); !reflect.DeepEqual(paths, []string{"bill_to.street", "ship_to.street"}) {
		t.Fatalf("pii %v", paths)
	}
	if err := s.ValidateAs([]byte(`{"id":"o","ship_to":{"street":"s","city":"c"},"bill_to":null}`), "application/json"); err != nil {
		t.Fatal(err)
	}
	js, err := c.PrismVersion(ctx, "json.orders", "1")
	if err != nil {
		t.Fatal(err)
	}
	var ve *registry.ValidationError
	if err := js.Validate([]byte(`{"id":"o","ship_to":{"street":"s"}}`)); !errors.As(err, &ve) || ve.Violations[0].Path != "$.ship_to" {
		t.Fatalf("json ref: %v", err)
	}
	if masked, err := js.MaskJSON([]byte(`{"id":"o","ship_to":{"street":"s","city":"c"}}`)); err != nil || !strings.Contains(string(masked), `"street":"***"`) {
		t.Fatalf("json mask: %s %v", masked, err)
	}
	if _, err := c.PrismVersion(ctx, "loop", "1"); !errors.Is(err, prismerr.ErrPayload) || !strings.Contains(err.Error(), "deep") {
		t.Fatalf("loop: %v", err)
	}
}
