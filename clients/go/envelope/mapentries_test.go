package envelope_test

import (
	"encoding/hex"
	"testing"

	"github.com/prism-envelope/prism/clients/go/envelope"
)

// TestOddMapEntriesReadAsUpbReadsThem: an observability labels entry with a third field, and
// one whose key has another wire type, are not labels (upb, under Python, keeps them among
// the unknown fields, re-encoded); a plain entry of the same key still is. The bytes expected
// are what Python's protobuf writes for the same input (tests/clients/test_go.py compares
// many more against Python itself).
func TestOddMapEntriesReadAsUpbReadsThem(t *testing.T) {
	env, err := envelope.NewJSON("orders.created", "order-events", map[string]int{"order_id": 1}, envelope.Options{})
	if err != nil {
		t.Fatal(err)
	}
	wire, _ := envelope.Encode(env, envelope.Reviewed)
	// observability (field 3): labels {tier: silver}, then {tier, field 10 "x"}, then {key as varint 5, value "gold"}
	obs, _ := hex.DecodeString("320e0a0474696572120673696c766572" + "32090a04746965725201" + "78" + "32080805120467" + "6f6c64")
	rec := append([]byte{0x1a, byte(len(obs))}, obs...)
	got, err := envelope.Decode(append(wire, rec...))
	if err != nil {
		t.Fatal(err)
	}
	o := got.Header.GetObservability()
	if len(o.GetLabels()) != 1 || o.GetLabels()["tier"] != "silver" {
		t.Fatalf("labels %v, want only tier=silver", o.GetLabels())
	}
	unknown := hex.EncodeToString(o.ProtoReflect().GetUnknown())
	if want := "32090a0474696572520178" + "3208120467" + "6f6c640805"; unknown != want {
		t.Fatalf("unknown fields %s, want %s (the odd entries as upb re-encodes them)", unknown, want)
	}
	if r := envelope.UnknownRecords(o.ProtoReflect()); len(r) != 0 {
		t.Fatalf("UnknownRecords reports %x; Python's unknown_records reports none (field 6 is known)", r)
	}
}
