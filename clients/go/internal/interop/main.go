// Command interop is the Go side of the cross-language tests (tests/clients/test_go.py, tests/clients/test_chain.py):
// it reads one JSON request on stdin, does what it names with the Go client, and writes one
// JSON response on stdout. Errors are reported as {"error": code, "message": ...}, never as
// a crash, so the Python test can assert on them.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/prism-envelope/prism/clients/go/encryption"
	"github.com/prism-envelope/prism/clients/go/encryption/awskms"
	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/internal/conformance"
	"github.com/prism-envelope/prism/clients/go/kafka"
	"github.com/prism-envelope/prism/clients/go/lnmp"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/registry"
	"github.com/prism-envelope/prism/clients/go/signing"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

type request struct {
	Op          string            `json:"op"`
	Brokers     []string          `json:"brokers"`
	Topic       string            `json:"topic"`
	Namespace   string            `json:"namespace"`
	Group       string            `json:"group"`
	Count       int               `json:"count"`
	TimeoutS    float64           `json:"timeout_s"`
	HMACKeyID   string            `json:"hmac_key_id"`
	HMACHex     string            `json:"hmac_hex"`
	Token       string            `json:"token"`
	PublisherID string            `json:"publisher_id"`
	Layout      string            `json:"layout"`
	Payloads    []json.RawMessage `json:"payloads"`
	Classify    string            `json:"classification"`
	Clearance   string            `json:"clearance"`
	Principal   string            `json:"principal"`
	AuditTopic  string            `json:"audit_topic"`
	Keyring     string            `json:"keyring"` // path of a Prism JSON keyring
	Algorithm   string            `json:"algorithm"`
	KeyID       string            `json:"key_id"`
	Envelopes   []string          `json:"envelopes"` // hex
	Plaintext   string            `json:"plaintext_hex"`
	Registry    string            `json:"registry_url"`
	User        string            `json:"user"`
	Password    string            `json:"password"`
	Payload     json.RawMessage   `json:"payload"`
	NackFirst   bool              `json:"nack_first"`
	// FixAuditTopic: on the first delivery_audit_failed, raise the audit topic's
	// max.message.bytes (what an operator would fix), publish one internal message, read on
	FixAuditTopic bool   `json:"fix_audit_topic"`
	SchemaText    string `json:"schema_text"`
	ContentType   string `json:"content_type"`
	AckReverse    bool   `json:"ack_reverse"`
	// an Ed25519 key to verify with too (the Prism worker's, for its re-signed outputs)
	Ed25519KeyID     string `json:"ed25519_key_id"`
	Ed25519PublicHex string `json:"ed25519_public_hex"`
	// AWS KMS (key_wrap): an endpoint (moto in the tests) and extra encryption context
	KMSEndpoint string            `json:"kms_endpoint"`
	KMSContext  map[string]string `json:"kms_context"`
}

// kmsProvider is the AWS KMS provider of the request (nil without kms_endpoint).
func kmsProvider(req request) *awskms.Provider {
	if req.KMSEndpoint == "" {
		return nil
	}
	client := kms.New(kms.Options{Region: "us-east-1", BaseEndpoint: &req.KMSEndpoint, RetryMaxAttempts: 1,
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{AccessKeyID: "testing", SecretAccessKey: "testing", Source: "interop"}, nil
		})})
	return &awskms.Provider{Client: client, EncryptionContext: req.KMSContext}
}

type result map[string]any

func fail(err error) result {
	var pe *prismerr.Error
	if errors.As(err, &pe) {
		return result{"error": pe.Code, "message": pe.Error()}
	}
	return result{"error": "untyped", "message": err.Error()}
}

func main() {
	var req request
	var out result
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		out = result{"error": "bad_request", "message": err.Error()}
	} else {
		out = run(req)
	}
	_ = json.NewEncoder(os.Stdout).Encode(out)
}

func layoutOf(s string) envelope.Layout {
	if s == "draft" {
		return envelope.Draft
	}
	return envelope.Reviewed
}

// keysOf is the request's HMAC signing key (nil without one) and the keys a subscriber
// verifies with: that HMAC key and the optional Ed25519 public key (nil when neither is given).
func keysOf(req request) (*signing.SigningKey, *signing.Keys, error) {
	var k *signing.SigningKey
	var keys *signing.Keys
	if req.HMACHex != "" {
		secret, err := hex.DecodeString(req.HMACHex)
		if err != nil {
			return nil, nil, err
		}
		if k, err = signing.NewHMACKey(req.HMACKeyID, secret); err != nil {
			return nil, nil, err
		}
		keys = signing.NewKeys(k.VerificationKey())
	}
	if req.Ed25519PublicHex != "" {
		public, err := hex.DecodeString(req.Ed25519PublicHex)
		if err != nil {
			return nil, nil, err
		}
		vk, err := signing.NewEd25519VerificationKey(req.Ed25519KeyID, public)
		if err != nil {
			return nil, nil, err
		}
		if keys == nil {
			keys = signing.NewKeys()
		}
		keys.Add(vk)
	}
	return k, keys, nil
}

func run(req request) result {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(req.TimeoutS*float64(time.Second))+30*time.Second)
	defer cancel()
	switch req.Op {
	case "decrypt": // decrypt each envelope with the keyring: plaintext hex or the error code
		kr, err := loadKeyring(req.Keyring)
		if err != nil {
			return fail(err)
		}
		if p := kmsProvider(req); p != nil {
			kr.DataKeys[p.WrapName()] = p
		}
		var outs []any
		for _, h := range req.Envelopes {
			data, _ := hex.DecodeString(h)
			env, err := envelope.Decode(data)
			if err == nil {
				var p []byte
				if p, err = encryption.Decrypt(env, kr, encryption.DecryptOptions{Context: ctx}); err == nil {
					outs = append(outs, result{"plaintext_hex": hex.EncodeToString(p)})
					continue
				}
			}
			outs = append(outs, fail(err))
		}
		return result{"results": outs}
	case "encrypt": // a new envelope around the plaintext, encrypted for key_id, in layout
		kr, err := loadKeyring(req.Keyring)
		if err != nil {
			return fail(err)
		}
		plain, _ := hex.DecodeString(req.Plaintext)
		env, err := envelope.NewBytes(req.Topic, req.Namespace, plain, envelope.Options{})
		if err != nil {
			return fail(err)
		}
		switch p := kmsProvider(req); {
		case p != nil: // a KMS data key wrapped under key_id
			err = encryption.EncryptWithDataKey(ctx, env, req.Algorithm, req.KeyID, p, encryption.Options{})
		case req.Algorithm == encryption.AES256GCM, req.Algorithm == encryption.ChaCha20Poly1305:
			err = encryption.EncryptSymmetric(env, req.Algorithm, req.KeyID, kr.Symmetric[req.KeyID], encryption.Options{})
		case req.Algorithm == encryption.MLKEM1024:
			err = encryption.EncryptMLKEM1024(env, req.KeyID, kr.MLKEM1024[req.KeyID].EncapsulationKey(), encryption.Options{})
		case req.Algorithm == encryption.X25519MLKEM1024:
			h := kr.Hybrid[req.KeyID]
			err = encryption.EncryptHybrid(env, req.KeyID, &encryption.HybridPublicKey{X25519: h.X25519.PublicKey(), MLKEM: h.MLKEM.EncapsulationKey()}, encryption.Options{})
		case req.Algorithm == encryption.RSAOAEP3072, req.Algorithm == encryption.RSAOAEP4096:
			err = encryption.EncryptRSA(env, req.KeyID, &kr.RSA[req.KeyID].PublicKey, encryption.Options{})
		default:
			err = fmt.Errorf("unknown algorithm %q", req.Algorithm)
		}
		if err != nil {
			return fail(err)
		}
		data, err := envelope.Encode(env, layoutOf(req.Layout))
		if err != nil {
			return fail(err)
		}
		return result{"envelope_hex": hex.EncodeToString(data)}
	case "sign": // sign each envelope (hex) as v2 in layout, and as a pair and a batch of all
		key, _, err := keysOf(req)
		if err != nil {
			return fail(err)
		}
		var v2, pairs []any
		var envs []*envelope.Envelope
		for _, h := range req.Envelopes {
			data, _ := hex.DecodeString(h)
			env, err := envelope.Decode(data)
			if err != nil {
				return fail(err)
			}
			s, err := signing.Sign(env.Clone(), key, layoutOf(req.Layout), signing.ScopeV2)
			if err != nil {
				return fail(err)
			}
			d, r, err := signing.SignPair(env.Clone(), key)
			if err != nil {
				return fail(err)
			}
			v2 = append(v2, hex.EncodeToString(s))
			pairs = append(pairs, []string{hex.EncodeToString(d), hex.EncodeToString(r)})
			envs = append(envs, env.Clone())
		}
		batch, err := signing.SignBatch(envs, key)
		if err != nil {
			return fail(err)
		}
		var b []any
		for _, c := range batch {
			b = append(b, []string{hex.EncodeToString(c[0]), hex.EncodeToString(c[1])})
		}
		return result{"v2": v2, "pair": pairs, "batch": b}
	case "validate": // validate each payload (JSON text, or hex with a protobuf content type) against a schema
		var outs []any
		sc := &registry.Schema{Text: req.SchemaText, Format: req.Algorithm}
		for _, p := range req.Envelopes {
			payload := []byte(p)
			if !strings.Contains(req.ContentType, "json") {
				payload, _ = hex.DecodeString(p)
			}
			err := sc.ValidateAs(payload, req.ContentType)
			r := result{"outcome": errString(err)}
			if err == nil {
				if req.ContentType == "application/protobuf" {
					if m, err := sc.MaskProto(payload); err == nil {
						r["masked_hex"] = hex.EncodeToString(m)
					} else {
						r["mask_error"] = errString(err)
					}
				} else if m, err := sc.MaskJSON(payload); err == nil {
					r["masked"] = json.RawMessage(m)
				}
			}
			if paths, err := sc.PIIPaths(); err == nil {
				r["pii_paths"] = paths
			}
			var ve *registry.ValidationError
			if errors.As(err, &ve) {
				r["path"] = ve.Violations[0].Path
			}
			outs = append(outs, r)
		}
		return result{"results": outs}
	case "lnmp": // map each LNMP input to an envelope (model) and back (re-encoded), or the error code
		var outs []any
		for _, h := range req.Envelopes {
			data, _ := hex.DecodeString(h)
			env, err := lnmp.ToEnvelope(data)
			if err != nil {
				outs = append(outs, result{"outcome": errString(err)})
				continue
			}
			m, _ := conformance.ModelRaw(env)
			r := result{"outcome": "ok", "model": m}
			if out, err := lnmp.FromEnvelope(env); err == nil {
				r["reencoded_hex"] = hex.EncodeToString(out)
			} else {
				r["reencode_error"] = errString(err)
			}
			outs = append(outs, r)
		}
		return result{"results": outs}
	case "check": // decode and verify each input as conformance.check does in Python
		return check(req)
	case "registry": // resolve each envelope's schema, mask its payload, validate req.payload
		return registryOp(ctx, req)
	case "publish":
		return publish(ctx, req)
	case "consume":
		return consume(ctx, req)
	}
	return result{"error": "bad_request", "message": "unknown op " + req.Op}
}

func loadKeyring(path string) (*encryption.Keyring, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return encryption.LoadFileKeyring(raw)
}

func publish(ctx context.Context, req request) result {
	key, _, err := keysOf(req)
	if err != nil {
		return fail(err)
	}
	cfg := kafka.Config{Brokers: req.Brokers, Namespace: req.Namespace, SigningKey: key, PublisherID: req.PublisherID,
		Layout: layoutOf(req.Layout)}
	if req.Token != "" {
		cfg.Token = func(context.Context) (string, error) { return req.Token, nil }
	}
	var schema *registry.Schema
	if req.Registry != "" { // validate before publish, and encode by the topic's schema when it is binary
		rc, err := registry.New(req.Registry)
		if err != nil {
			return fail(err)
		}
		rc.Username, rc.Password = req.User, req.Password
		cfg.Validator = &registry.Validator{Client: rc}
		if schema, err = rc.PrismVersion(ctx, req.Topic, "latest"); err != nil {
			return fail(err)
		}
	}
	c, err := kafka.New(cfg)
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	var kr *encryption.Keyring
	if req.Keyring != "" {
		if kr, err = loadKeyring(req.Keyring); err != nil {
			return fail(err)
		}
	}
	var ids []string
	for _, p := range req.Payloads {
		opts := envelope.Options{DataClassification: req.Classify, CorrelationID: "interop"}
		var env *envelope.Envelope
		if req.ContentType == "application/protobuf" && schema != nil {
			// the JSON payload read by the schema (protobuf JSON mapping), sent in the wire format
			var msg any
			if msg, err = schema.Decode(p, "application/json"); err == nil {
				var wire []byte
				if wire, err = proto.Marshal(msg.(proto.Message)); err == nil {
					opts.ContentType = req.ContentType
					env, err = envelope.NewBytes(req.Topic, req.Namespace, wire, opts)
				}
			}
		} else {
			env, err = envelope.NewJSON(req.Topic, req.Namespace, p, opts)
		}
		if err != nil {
			return fail(err)
		}
		if kr != nil {
			if err := encryption.EncryptSymmetric(env, encryption.AES256GCM, req.KeyID, kr.Symmetric[req.KeyID], encryption.Options{}); err != nil {
				return fail(err)
			}
		}
		id, err := c.Publish(ctx, req.Topic, env, kafka.PublishOptions{})
		if err != nil {
			return fail(err)
		}
		ids = append(ids, id)
	}
	return result{"message_ids": ids}
}

func consume(ctx context.Context, req request) result {
	key, keys, err := keysOf(req)
	if err != nil {
		return fail(err)
	}
	c, err := kafka.New(kafka.Config{Brokers: req.Brokers, Namespace: req.Namespace, SigningKey: key}) // key signs audit records
	if err != nil {
		return fail(err)
	}
	defer c.Close()
	var kr *encryption.Keyring
	if req.Keyring != "" {
		if kr, err = loadKeyring(req.Keyring); err != nil {
			return fail(err)
		}
	}
	var resolver *registry.Resolver
	if req.Registry != "" {
		rc, err := registry.New(req.Registry)
		if err != nil {
			return fail(err)
		}
		rc.Username, rc.Password = req.User, req.Password
		resolver = registry.NewResolver(rc)
	}
	type payload = map[string]any
	sub, err := kafka.SubscribeTyped[payload](ctx, c, req.Topic, kafka.SubscribeConfig{Group: req.Group, Keys: keys,
		Clearance: req.Clearance, Principal: req.Principal, AuditTopic: req.AuditTopic})
	if err != nil {
		return fail(err)
	}
	defer sub.Close()
	deadline, cancel := context.WithTimeout(ctx, time.Duration(req.TimeoutS*float64(time.Second)))
	defer cancel()
	var got []any
	var errs []any
	var held []*kafka.Message
	nacked := false
	absorbed := 0 // the audit failure fix_audit_topic answers: reported, not counted
	for len(got)+len(errs)-absorbed < req.Count {
		m, err := sub.Subscription.Next(deadline)
		if m == nil && req.FixAuditTopic && errors.Is(err, prismerr.ErrDeliveryAudit) {
			req.FixAuditTopic = false
			errs = append(errs, fail(err))
			absorbed++
			if err := fixAuditTopic(deadline, c, req); err != nil {
				errs = append(errs, fail(err))
				break
			}
			continue
		}
		if m == nil {
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				errs = append(errs, fail(err))
			}
			break
		}
		if err != nil {
			errs = append(errs, fail(err))
			_ = m.Ack(ctx)
			continue
		}
		if req.NackFirst && !nacked {
			nacked = true
			if err := m.Nack(ctx); err != nil {
				errs = append(errs, fail(err))
			}
			continue
		}
		env := m.Envelope
		if kr != nil && env.IsEncrypted() {
			if env, err = encryption.DecryptToEnvelope(env, kr, encryption.DecryptOptions{}); err != nil {
				errs = append(errs, fail(err))
				_ = m.Ack(ctx)
				continue
			}
		}
		var p any
		var decodedBy result
		if resolver != nil {
			p, decodedBy, err = decodeBySchema(ctx, resolver, env)
		} else {
			p, err = envelope.JSONPayload[payload](env)
		}
		if err != nil {
			errs = append(errs, fail(err))
			_ = m.Ack(ctx)
			continue
		}
		item := result{"message_id": env.Header.GetMetadata().GetMessageId(), "payload": p, "decoded_by": decodedBy,
			"classification": kafka.ClassificationOf(env), "publisher_id": env.Header.GetSecurity().GetPublisherId(),
			"has_token": env.Header.GetSecurity().GetAuthToken() != ""}
		if m.Signature != nil {
			item["scope"] = m.Signature.Scope.String()
			item["key_id"] = m.Signature.KeyID
		}
		sc := env.Header.GetSchema()
		item["schema"] = result{"name": sc.GetSchemaName(), "version": sc.GetSchemaVersion(), "format": sc.GetSchemaFormat(), "hash": sc.GetSchemaHash(), "url": sc.GetSchemaUrl()}
		extensions := map[string]string{}
		for k, v := range env.Header.GetExtensions() {
			extensions[k] = string(v)
		}
		item["extensions"] = extensions
		headers := map[string]string{}
		for _, h := range m.Record.Headers {
			headers[h.Key] = string(h.Value)
		}
		item["headers"] = headers
		got = append(got, item)
		if req.AckReverse {
			held = append(held, m)
			continue
		}
		if err := m.Ack(ctx); err != nil {
			errs = append(errs, fail(err))
		}
	}
	committed := map[string]int64{}
	for i := len(held) - 1; i >= 0; i-- {
		if err := held[i].Ack(ctx); err != nil {
			errs = append(errs, fail(err))
		}
		if i > 0 { // nothing may be committed while the first message is not acknowledged
			c, err := sub.Committed(ctx)
			if err != nil {
				errs = append(errs, fail(err))
			}
			if c[0] > 0 {
				errs = append(errs, result{"error": "committed_early", "message": fmt.Sprint(c)})
			}
		}
	}
	if c, err := sub.Committed(ctx); err == nil {
		for p, o := range c {
			committed[fmt.Sprint(p)] = o
		}
	} else {
		errs = append(errs, fail(err))
	}
	st := sub.Stats()
	return result{"messages": got, "errors": errs, "committed": committed,
		"stats": result{"received": st.Received, "withheld": st.Withheld, "expired": st.Expired, "audited": st.Audited,
			"refusal_records": st.RefusalRecords}}
}

// fixAuditTopic raises the audit topic's record size limit, as an operator answering the
// subscriber's delivery_audit_failed would, and publishes one internal message after the
// refused ones, so the subscription has something it may read once they are audited.
func fixAuditTopic(ctx context.Context, c *kafka.Client, req request) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(req.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	limit := "1048588"
	res, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Name: "max.message.bytes", Value: &limit}}, req.AuditTopic)
	for _, r := range res {
		if err == nil && r.Err != nil {
			err = fmt.Errorf("%s: %w %s", r.Name, r.Err, r.ErrMessage)
		}
	}
	if err != nil {
		return err
	}
	// The broker answers AlterConfigs once the controller has the change; the partition's
	// leader applies it when it replays the metadata a moment later. Until then it still
	// refuses the record (a second delivery_audit_failed, seen once under load), so wait
	// until a broker describes the new limit.
	adm := kadm.NewClient(cl)
	for {
		rcs, err := adm.DescribeTopicConfigs(ctx, req.AuditTopic)
		if err == nil {
			if rc, err := rcs.On(req.AuditTopic, nil); err == nil && rc.Err == nil {
				applied := false
				for _, cfg := range rc.Configs {
					applied = applied || (cfg.Key == "max.message.bytes" && cfg.Value != nil && *cfg.Value == limit)
				}
				if applied {
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	env, err := envelope.NewJSON(req.Topic, req.Namespace, map[string]any{"after_fix": true}, envelope.Options{DataClassification: "internal"})
	if err != nil {
		return err
	}
	_, err = c.Publish(ctx, req.Topic, env, kafka.PublishOptions{})
	return err
}

// decodeBySchema resolves the schema env references through the registry (checked:
// subject of its topic, hash) and decodes the payload by it: the payload as JSON-ready values,
// and what decoded it (subject, version, format, the protobuf message type, masked payload).
func decodeBySchema(ctx context.Context, resolver *registry.Resolver, env *envelope.Envelope) (any, result, error) {
	s, err := resolver.ForEnvelope(ctx, env)
	if err != nil {
		return nil, nil, err
	}
	raw, err := env.PayloadBytes()
	if err != nil {
		return nil, nil, err
	}
	ct := envelope.ContentType(env.Header.GetMetadata())
	decoded, err := s.Decode(raw, ct)
	if err != nil {
		return nil, nil, err
	}
	by := result{"subject": s.Subject, "version": s.Version, "format": s.Kind(), "content_type": ct}
	if m, ok := decoded.(proto.Message); ok {
		by["type"] = string(m.ProtoReflect().Descriptor().FullName())
	}
	if masked, err := s.MaskPII(decoded); err == nil {
		by["masked"] = jsonable(masked)
	}
	return jsonable(decoded), by, nil
}

func registryOp(ctx context.Context, req request) result {
	c, err := registry.New(req.Registry)
	if err != nil {
		return fail(err)
	}
	c.Username, c.Password = req.User, req.Password
	res := registry.NewResolver(c)
	var outs []any
	for _, h := range req.Envelopes {
		data, _ := hex.DecodeString(h)
		env, err := envelope.Decode(data)
		if err != nil {
			outs = append(outs, fail(err))
			continue
		}
		s, err := res.ForEnvelope(ctx, env)
		if err != nil {
			outs = append(outs, fail(err))
			continue
		}
		p, err := env.PayloadBytes()
		if err != nil {
			outs = append(outs, fail(err))
			continue
		}
		ct := envelope.ContentType(env.Header.GetMetadata())
		paths, _ := s.PIIPaths()
		r := result{"subject": s.Subject, "version": s.Version, "format": s.Kind(), "pii_paths": paths,
			"content_type": ct, "valid": errString(s.ValidateAs(p, ct))}
		decoded, err := s.Decode(p, ct) // the payload by the schema the envelope references
		if err != nil {
			r["decode_error"] = errString(err)
		} else {
			r["decoded"] = jsonable(decoded)
			if masked, err := s.MaskPII(decoded); err == nil {
				r["masked"] = jsonable(masked)
			} else {
				r["mask_error"] = errString(err)
			}
		}
		outs = append(outs, r)
	}
	out := result{"results": outs}
	if len(req.Payload) > 0 { // publish-side validation: the Validator a kafka.Client uses
		env, err := envelope.NewJSON(req.Topic, req.Namespace, req.Payload, envelope.Options{})
		if err != nil {
			return fail(err)
		}
		v := &registry.Validator{Client: c}
		err = v.ValidateEnvelope(ctx, req.Topic, env)
		var ve *registry.ValidationError
		if errors.As(err, &ve) {
			var paths []string
			for _, x := range ve.Violations {
				paths = append(paths, x.Path)
			}
			out["violations"] = paths
		}
		out["validate"] = errString(err)
		sc := env.Header.GetSchema()
		out["schema_context"] = result{"url": sc.GetSchemaUrl(), "version": sc.GetSchemaVersion(), "format": sc.GetSchemaFormat(), "hash": sc.GetSchemaHash()}
	}
	return out
}

// jsonable turns a decoded payload into JSON-ready values: a protobuf message as its JSON
// mapping with the .proto field names (Python's MessageToDict(preserving_proto_field_name=True)),
// bytes as {"$bytes": hex}, int32/float32 widened; masked protobuf messages likewise.
func jsonable(v any) any {
	switch x := v.(type) {
	case proto.Message:
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(x)
		if err != nil {
			return map[string]any{"$error": err.Error()}
		}
		var out any
		_ = json.Unmarshal(b, &out)
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = jsonable(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = jsonable(e)
		}
		return out
	case []byte:
		return map[string]any{"$bytes": hex.EncodeToString(x)}
	case int32:
		return int64(x)
	case float32:
		return float64(x)
	}
	return v
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	var pe *prismerr.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return "untyped: " + err.Error()
}

// check answers, for each input, what `python -m conformance.check decode|verify` answers:
// the decode outcome (error kind or ok, with the model; a payload that is not an Any gives the
// header alone and payload_error) and the verify outcome with every signature vector's key.
func check(req request) result {
	files, err := conformance.SignatureFiles()
	if err != nil {
		return fail(err)
	}
	keys := signing.NewKeys()
	for _, f := range files {
		k := f.Key
		switch k.Algorithm {
		case signing.HMACSHA256:
			secret, _ := hex.DecodeString(k.SecretHex)
			sk, err := signing.NewHMACKey(k.KeyID, secret)
			if err != nil {
				return fail(err)
			}
			keys.Add(sk.VerificationKey())
		case signing.Ed25519:
			pub, _ := hex.DecodeString(k.PublicKeyHex)
			vk, err := signing.NewEd25519VerificationKey(k.KeyID, pub)
			if err != nil {
				return fail(err)
			}
			keys.Add(vk)
		}
	}
	var outs []any
	for _, h := range req.Envelopes {
		data, _ := hex.DecodeString(h)
		r := result{}
		env, err := envelope.Decode(data)
		r["decode"] = conformance.Verdict(err, "ok")
		if err == nil {
			if m, err := conformance.ModelRaw(env); err == nil {
				r["model"] = m
			} else {
				r["model"] = conformance.ToJSONRaw(env.Header.ProtoReflect())
				r["payload_error"] = conformance.Verdict(err, "ok")
			}
		}
		signing.ClearVerificationCache()
		_, info, err := signing.VerifyAndDecode(data, keys, signing.VerifyOptions{})
		r["verify"] = conformance.Verdict(err, "valid")
		if err == nil {
			r["scope"] = int(info.Scope)
		}
		if req.Layout == "convert" { // and the input converted to each layout (hex, or the error kind)
			for name, lay := range map[string]envelope.Layout{"to_draft": envelope.Draft, "to_reviewed": envelope.Reviewed} {
				if out, _, err := envelope.Convert(data, lay); err == nil {
					r[name] = hex.EncodeToString(out)
				} else {
					r[name] = conformance.Verdict(err, "ok")
				}
			}
		}
		outs = append(outs, r)
	}
	return result{"results": outs}
}
