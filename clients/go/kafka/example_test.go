package kafka_test

import (
	"context"
	"fmt"
	"log"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/kafka"
	"github.com/prism-envelope/prism/clients/go/signing"
)

type Order struct {
	OrderID int    `json:"order_id"`
	Email   string `json:"email"`
}

// The quick start of docs/sdk-go.md (compiled by go test; it needs a broker to run).
func Example_quickStart() {
	ctx := context.Background()
	key, err := signing.NewHMACKey("orders-producer-1", []byte("a shared secret of at least 32 bytes!"))
	if err != nil {
		log.Fatal(err)
	}
	client, err := kafka.New(kafka.Config{
		Brokers:    []string{"127.0.0.1:9092"},
		Namespace:  "order-events",
		SigningKey: key,
		Token:      func(context.Context) (string, error) { return "<a JWT for the worker>", nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	id, err := kafka.PublishJSON(ctx, client, "orders.created", Order{OrderID: 42, Email: "jane@example.com"},
		envelope.Options{CorrelationID: "req-1", DataClassification: "internal"}, kafka.PublishOptions{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("published", id)

	sub, err := kafka.SubscribeTyped[Order](ctx, client, "orders.created", kafka.SubscribeConfig{
		Group: "billing",
		Keys:  signing.NewKeys(key.VerificationKey()),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	order, msg, err := sub.Next(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(order.OrderID, msg.Envelope.Header.GetMetadata().GetMessageId(), msg.Signature.Scope)
	_ = msg.Ack(ctx)
}
