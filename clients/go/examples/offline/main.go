// Command offline is a program in a module of its own that uses the Prism Go client the way
// an application does before the client's module path is published: its go.mod requires
// github.com/prism-envelope/prism/clients/go and replaces it with this checkout (../..).
// It needs no broker: it builds, signs, encodes, converts, verifies and decodes an envelope,
// and prints one line. The client's tests build and run it (internal/modcheck).
package main

import (
	"fmt"
	"os"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/signing"
)

type Order struct {
	OrderID int    `json:"order_id"`
	Email   string `json:"email"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err) // a *prismerr.Error: code, what, where, fix
		os.Exit(1)
	}
}

func run() error {
	key, err := signing.NewEd25519Key("example-producer", make([]byte, 32))
	if err != nil {
		return err
	}
	env, err := envelope.NewJSON("orders.created", "order-events", Order{OrderID: 42, Email: "jane@example.com"},
		envelope.Options{CorrelationID: "req-1"})
	if err != nil {
		return err
	}
	wire, err := signing.Sign(env, key, envelope.Reviewed, signing.ScopeV2)
	if err != nil {
		return err
	}
	draft, _, err := envelope.Convert(wire, envelope.Draft)
	if err != nil {
		return err
	}
	got, info, err := signing.VerifyAndDecode(wire, signing.NewKeys(key.VerificationKey()), signing.VerifyOptions{})
	if err != nil {
		return err
	}
	order, err := envelope.JSONPayload[Order](got)
	if err != nil {
		return err
	}
	fmt.Printf("ok order=%d key=%s scope=%d reviewed=%dB draft=%dB\n", order.OrderID, info.KeyID, info.Scope, len(wire), len(draft))
	return nil
}
