package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prism-envelope/prism/clients/go/envelope"
	"github.com/prism-envelope/prism/clients/go/prismerr"
	"github.com/prism-envelope/prism/clients/go/signing"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"google.golang.org/protobuf/proto"
)

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// Validator checks an envelope before it is published (the registry package's Validator
// validates the payload against the topic's registered schema).
type Validator interface {
	ValidateEnvelope(ctx context.Context, topic string, env *envelope.Envelope) error
}

// Config configures a Client. Brokers and Namespace are required.
type Config struct {
	Brokers   []string
	Namespace string
	// Layout of published values; Auto picks by topic (<topic>.v2 draft, otherwise reviewed).
	Layout envelope.Layout
	// SigningKey signs every published envelope (scope v2, the SDK default); nil: unsigned.
	SigningKey *signing.SigningKey
	// PublisherID / PublisherTeam state the publisher (the worker replaces them with the
	// identity it verifies).
	PublisherID, PublisherTeam string
	// Token returns the JWT attached to each published envelope (security.auth_token); the
	// worker's authenticate stage verifies it and strips it. nil: no token.
	Token func(ctx context.Context) (string, error)
	// Validator, when set, checks every envelope before it is sent (Publish fails, nothing sent).
	Validator Validator
	// Partitions of topics the client creates (default 1); CreateTopics: create a missing
	// topic before first use, as the Python SDK does (default true unless NoCreateTopics).
	Partitions     int32
	NoCreateTopics bool
	// Opts are extra franz-go options (SASL, TLS, ...).
	Opts []kgo.Opt
}

// Client publishes and subscribes Prism envelopes.
type Client struct {
	cfg    Config
	cl     *kgo.Client
	admin  *kadm.Client
	mu     sync.Mutex
	topics map[string]bool
}

// New connects a client (franz-go connects lazily; errors surface on first use).
func New(cfg Config) (*Client, error) {
	if len(cfg.Brokers) == 0 || cfg.Namespace == "" {
		return nil, prismerr.New("bad_config", "kafka.Config needs Brokers and Namespace", `e.g. kafka.Config{Brokers: []string{"127.0.0.1:9092"}, Namespace: "order-events"}`)
	}
	if why := envelope.NameProblem(cfg.Namespace); why != "" {
		// every envelope carries it: refused here, not on every publish and audit record
		return nil, prismerr.New("bad_config", "kafka.Config Namespace "+why, "a namespace names a team's "+
			"messages, e.g. order-events").At("Namespace")
	}
	if cfg.Partitions <= 0 {
		cfg.Partitions = 1
	}
	opts := append([]kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.DisableIdempotentWrite(),
		kgo.ProducerLinger(0)}, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, (&prismerr.Error{Code: "bad_config", What: "cannot create the Kafka client: " + err.Error()}).Wrap(err)
	}
	return &Client{cfg: cfg, cl: cl, admin: kadm.NewClient(cl), topics: map[string]bool{}}, nil
}

// Close closes the client.
func (c *Client) Close() { c.cl.Close() }

// Kgo returns the underlying franz-go client (for tools and tests).
func (c *Client) Kgo() *kgo.Client { return c.cl }

func brokerErr(what string, err error) error {
	return (&prismerr.Error{Code: "broker_error", What: what + ": " + err.Error(),
		Hint: "check the brokers and that Kafka runs; the message may or may not be stored, retry with the same message id"}).Wrap(err)
}

// EnsureTopic creates topic with Config.Partitions partitions when it is missing (once per
// client); an existing topic is left as it is.
func (c *Client) EnsureTopic(ctx context.Context, topic string) error {
	if c.cfg.NoCreateTopics {
		return nil
	}
	c.mu.Lock()
	known := c.topics[topic]
	c.mu.Unlock()
	if known {
		return nil
	}
	resp, err := c.admin.CreateTopic(ctx, c.cfg.Partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		return brokerErr("cannot create topic "+quote(topic), err)
	}
	c.mu.Lock()
	c.topics[topic] = true
	c.mu.Unlock()
	return nil
}

func (c *Client) layoutFor(topic string) envelope.Layout {
	if c.cfg.Layout != envelope.Auto {
		return c.cfg.Layout
	}
	if l, ok := LayoutForTopic(topic); ok {
		return l
	}
	return envelope.Reviewed
}

// PublishOptions tune one publish. Key is the partition key (default: the correlation id).
type PublishOptions struct {
	Key []byte
}

// prepare stamps the client's identity and token into env, validates, signs and encodes it.
func (c *Client) prepare(ctx context.Context, topic string, env *envelope.Envelope, o PublishOptions) (*kgo.Record, error) {
	if env.Header.GetMetadata().GetTopic() == "" {
		env.Metadata().Topic = topic
	}
	if env.Header.GetMetadata().GetNamespace() == "" {
		env.Metadata().Namespace = c.cfg.Namespace
	}
	if c.cfg.PublisherID != "" || c.cfg.PublisherTeam != "" || c.cfg.Token != nil {
		sec := env.EnsureSecurity()
		if c.cfg.PublisherID != "" {
			sec.PublisherId = proto.String(c.cfg.PublisherID)
		}
		if c.cfg.PublisherTeam != "" {
			sec.PublisherTeam = proto.String(c.cfg.PublisherTeam)
		}
		if c.cfg.Token != nil {
			tok, err := c.cfg.Token(ctx)
			if err != nil {
				return nil, (&prismerr.Error{Code: "auth_failed", What: "the token source failed: " + err.Error(), Hint: "check the token provider"}).Wrap(err)
			}
			sec.AuthToken = proto.String(tok)
		}
	}
	if c.cfg.Validator != nil {
		if err := c.cfg.Validator.ValidateEnvelope(ctx, topic, env); err != nil {
			return nil, err
		}
	}
	layout := c.layoutFor(topic)
	var value []byte
	var err error
	if c.cfg.SigningKey != nil {
		value, err = signing.Sign(env, c.cfg.SigningKey, layout, signing.ScopeV2)
	} else {
		value, err = envelope.Encode(env, layout)
	}
	if err != nil {
		return nil, err
	}
	return NewRecord(topic, env, layout, value, o.Key), nil
}

// Publish sends env to topic and returns its message id once Kafka acknowledged it
// (acks=all). The envelope gets the client's publisher identity, token and signature.
func (c *Client) Publish(ctx context.Context, topic string, env *envelope.Envelope, o PublishOptions) (string, error) {
	if err := c.EnsureTopic(ctx, topic); err != nil {
		return "", err
	}
	rec, err := c.prepare(ctx, topic, env, o)
	if err != nil {
		return "", err
	}
	if err := c.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return "", brokerErr("Kafka did not confirm the publish", err)
	}
	return env.Header.GetMetadata().GetMessageId(), nil
}

// PublishJSON builds an envelope around v (compact JSON) and publishes it: the typed
// one-call form, PublishJSON[Order](ctx, client, "orders.created", order, opts).
func PublishJSON[T any](ctx context.Context, c *Client, topic string, v T, eo envelope.Options, o PublishOptions) (string, error) {
	env, err := envelope.NewJSON(topic, c.cfg.Namespace, v, eo)
	if err != nil {
		return "", err
	}
	return c.Publish(ctx, topic, env, o)
}

// SubscribeConfig configures a subscription.
type SubscribeConfig struct {
	Group string // required: the consumer group
	// Keys verify every message's signature before it is decoded (nil: not verified).
	Keys *signing.Keys
	// Clearance: public | internal (default) | confidential | restricted. A message
	// classified above it is never handed out: it is counted in Stats, written in a
	// classified_refused audit record (shared by the refusals met before the next message is
	// handed out or more are fetched, RefusalsPerRecord at most) and only then committed, so
	// it does not come back. confidential/restricted need Principal: every delivery of such
	// data first writes an audit record to AuditTopic (default prism.audit); if that write
	// fails the message is not delivered and Next returns the error.
	Clearance, Principal, AuditTopic string
	// KeepExpired delivers messages past their TTL; by default they are acknowledged and
	// skipped (Stats().Expired), as in the Python SDK.
	KeepExpired bool
	// Limits of the decoder (nil: envelope.DefaultLimits).
	Limits *envelope.Limits
	// Opts are extra franz-go consumer options.
	Opts []kgo.Opt
}

// Stats count what a subscription received, withheld (above its clearance), dropped as
// expired, and audited.
type Stats struct {
	Received, Withheld, Expired, Audited, RefusalRecords int
}

// Subscription reads one topic in a consumer group with read_committed isolation (records
// of aborted transactions are never delivered) and manual commits (Message.Ack).
type Subscription struct {
	c          *Client
	cl         *kgo.Client
	topic      string
	cfg        SubscribeConfig
	level      string
	auditTopic string
	buf        []*kgo.Record
	mu         sync.Mutex
	stats      Stats
	parts      map[int32]*partState
	// refused: withheld messages held (not committed) until their shared audit record is written
	refused      []heldRefusal
	refusedBytes int
	refusalErr   error // a refusal record that failed after a message was handed out: the next Next returns it
	auditReady   bool  // the audit topic was ensured
}

// heldRefusal is one withheld message waiting for its audit record.
type heldRefusal struct {
	m     *Message
	env   *envelope.Envelope
	entry refusalEntry
}

// partState tracks one partition's deliveries, so that a commit never skips a message that
// is still being processed (as the Python SDK's Kafka backend does): offsets are committed
// up to the end of the prefix of delivered offsets that are all acknowledged.
type partState struct {
	epoch     int     // bumped by a nack or a revocation: older deliveries are stale
	delivered []int64 // delivered, not yet committed, in order
	done      map[int64]bool
}

func (s *Subscription) state(p int32) *partState {
	st := s.parts[p]
	if st == nil {
		st = &partState{done: map[int64]bool{}}
		s.parts[p] = st
	}
	return st
}

func (s *Subscription) buffered() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.buf)
}

// Committed returns the group's committed offset of each partition of the topic (what a
// restarted consumer of the group would resume from).
func (s *Subscription) Committed(ctx context.Context) (map[int32]int64, error) {
	resp, err := kadm.NewClient(s.cl).FetchOffsets(ctx, s.cfg.Group)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		return nil, brokerErr("cannot read the committed offsets", err)
	}
	out := map[int32]int64{}
	for p, o := range resp[s.topic] {
		out[p] = o.At
	}
	return out, nil
}

// forget drops what is known of partitions (revoked or lost in a rebalance, or nacked):
// their un-acknowledged messages come again, and deliveries handed out before are stale.
func (s *Subscription) forget(parts []int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	drop := map[int32]bool{}
	for _, p := range parts {
		drop[p] = true
		st := s.state(p)
		st.epoch++
		st.delivered, st.done = nil, map[int64]bool{}
	}
	kept := s.buf[:0]
	for _, r := range s.buf {
		if !drop[r.Partition] {
			kept = append(kept, r)
		}
	}
	s.buf = kept
}

// Message is one delivery. Envelope is nil when the record could not be decoded or
// verified: Next then also returns the typed error, and the caller decides (Ack skips it,
// Nack has it delivered again; nothing is dropped silently).
type Message struct {
	Envelope  *envelope.Envelope
	Signature *signing.Info
	Record    *kgo.Record
	sub       *Subscription
	epoch     int
}

// Ack marks the message done and commits its partition up to the end of the prefix of
// delivered messages that are all done, so a commit never skips a message still being
// processed; messages may be acknowledged in any order. Acknowledging a stale delivery (its
// partition was nacked or moved to another consumer since) does nothing.
func (m *Message) Ack(ctx context.Context) error {
	s := m.sub
	s.mu.Lock()
	st := s.state(m.Record.Partition)
	if st.epoch != m.epoch {
		s.mu.Unlock()
		return nil
	}
	st.done[m.Record.Offset] = true
	var commit int64 = -1
	for len(st.delivered) > 0 && st.done[st.delivered[0]] {
		commit = st.delivered[0] + 1
		delete(st.done, st.delivered[0])
		st.delivered = st.delivered[1:]
	}
	s.mu.Unlock()
	if commit < 0 {
		return nil
	}
	offsets := map[string]map[int32]kgo.EpochOffset{m.Record.Topic: {m.Record.Partition: {Epoch: m.Record.LeaderEpoch, Offset: commit}}}
	var cerr error
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			cerr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerr.ErrorForCode(p.ErrorCode); e != nil && cerr == nil {
					cerr = e
				}
			}
		}
	})
	if cerr != nil {
		return brokerErr("cannot commit the offset", cerr)
	}
	return nil
}

// Nack gives the message back: its partition is rewound to it, so it and every later
// message of the partition are fetched again (deliveries already handed out for those
// offsets become stale).
func (m *Message) Nack(ctx context.Context) error {
	s := m.sub
	s.mu.Lock()
	stale := s.state(m.Record.Partition).epoch != m.epoch
	s.mu.Unlock()
	if stale {
		return nil
	}
	s.forget([]int32{m.Record.Partition})
	s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{m.Record.Topic: {m.Record.Partition: {Epoch: -1, Offset: m.Record.Offset}}})
	return nil
}

// Subscribe starts a subscription to topic.
func (c *Client) Subscribe(ctx context.Context, topic string, cfg SubscribeConfig) (*Subscription, error) {
	if cfg.Group == "" {
		return nil, prismerr.New("bad_config", "SubscribeConfig.Group is required", "name the consumer group, e.g. \"billing\"").At("SubscribeConfig.Group")
	}
	level, auditTopic, err := clearance(cfg.Clearance, cfg.Principal, cfg.AuditTopic, topic)
	if err != nil {
		return nil, err
	}
	if err := c.EnsureTopic(ctx, topic); err != nil {
		return nil, err
	}
	if audited(level) {
		if err := c.EnsureTopic(ctx, auditTopic); err != nil {
			return nil, err
		}
	}
	s := &Subscription{c: c, topic: topic, cfg: cfg, level: level, auditTopic: auditTopic, parts: map[int32]*partState{}}
	lose := func(_ context.Context, _ *kgo.Client, lost map[string][]int32) { s.forget(lost[topic]) }
	opts := append([]kgo.Opt{kgo.SeedBrokers(c.cfg.Brokers...), kgo.ConsumerGroup(cfg.Group), kgo.ConsumeTopics(topic),
		kgo.DisableAutoCommit(), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6 * time.Second),
		kgo.OnPartitionsRevoked(lose), kgo.OnPartitionsLost(lose)}, c.cfg.Opts...)
	opts = append(opts, cfg.Opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, (&prismerr.Error{Code: "bad_config", What: "cannot create the Kafka consumer: " + err.Error()}).Wrap(err)
	}
	s.cl = cl
	return s, nil
}

// Close leaves the group and closes the consumer.
func (s *Subscription) Close() { s.cl.Close() }

// Stats returns the counters so far.
func (s *Subscription) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Next returns the next message the application may see. Messages above the clearance are
// committed and skipped; confidential and restricted ones are audited first. A record that
// does not decode or verify comes back as a Message without an Envelope, with the error.
// ctx ending returns ctx's error and no message.
func (s *Subscription) Next(ctx context.Context) (*Message, error) {
	if err := s.refusalErr; err != nil {
		s.refusalErr = nil
		return nil, err
	}
	for {
		for s.buffered() == 0 {
			// held refusals are written before waiting for more
			if err := s.flushRefusals(ctx); err != nil {
				return nil, err
			}
			fetches := s.cl.PollFetches(ctx)
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			var ferr error
			fetches.EachError(func(t string, p int32, err error) {
				if ferr == nil && !errors.Is(err, context.Canceled) {
					ferr = brokerErr("fetch from "+t+"/"+strconv.Itoa(int(p))+" failed", err)
				}
			})
			if ferr != nil {
				return nil, ferr
			}
			s.mu.Lock()
			s.buf = append(s.buf, fetches.Records()...)
			s.mu.Unlock()
		}
		s.mu.Lock()
		if len(s.buf) == 0 {
			s.mu.Unlock()
			continue
		}
		rec := s.buf[0]
		s.buf = s.buf[1:]
		st := s.state(rec.Partition)
		st.delivered = append(st.delivered, rec.Offset)
		m := &Message{Record: rec, sub: s, epoch: st.epoch}
		s.mu.Unlock()
		env, info, err := DecodeRecord(rec, DecodeOptions{Keys: s.cfg.Keys, Limits: s.cfg.Limits})
		s.mu.Lock()
		s.stats.Received++
		s.mu.Unlock()
		if err != nil {
			return m, err
		}
		m.Envelope, m.Signature = env, info
		class := ClassificationOf(env)
		if rank(class) > rank(s.level) {
			s.mu.Lock()
			s.stats.Withheld++
			s.mu.Unlock()
			md := env.Header.GetMetadata()
			e := refusalEntry{MessageID: md.GetMessageId(), Namespace: md.GetNamespace(), Classification: class, Ref: refOf(rec)}
			s.refused = append(s.refused, heldRefusal{m, env, e})
			s.refusedBytes += e.bytes()
			if len(s.refused) >= RefusalsPerRecord || s.refusedBytes >= RefusalRecordBytes {
				if err := s.flushRefusals(ctx); err != nil {
					return nil, err
				}
			}
			continue
		}
		if !s.cfg.KeepExpired {
			if env.IsExpired(time.Now()) {
				s.mu.Lock()
				s.stats.Expired++
				s.mu.Unlock()
				if err := m.Ack(ctx); err != nil {
					return nil, err
				}
				continue
			}
		}
		if audited(class) {
			if err := s.audit(ctx, env, class, rec); err != nil {
				return nil, err
			}
		}
		// the refusals met on the way to m are written before it is handed out; when that
		// fails m is still handed out and the next call returns the error (as in Python)
		s.refusalErr = s.flushRefusals(ctx)
		return m, nil
	}
}

func refOf(rec *kgo.Record) string {
	return rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "@" + strconv.FormatInt(rec.Offset, 10)
}

// encodeAudit is an audit record in its envelope (JSON, classified internal), signed with the
// client's key when it has one, in the audit topic's layout: the bytes Python's writer sends.
//
// correlationID is the audited message's id. One the worker would refuse as an id (only a
// producer outside Prism writes one) is left out, as the Python SDK does: the record still
// names it, and the audit record must be written whatever the message carries - the message
// would otherwise be fetched again for good.
func (s *Subscription) encodeAudit(record any, correlationID string) (*envelope.Envelope, []byte, envelope.Layout, error) {
	layout := s.c.layoutFor(s.auditTopic)
	if envelope.IDProblem(correlationID) != "" {
		correlationID = ""
	}
	aenv, err := envelope.NewJSON(s.auditTopic, s.c.cfg.Namespace, record, envelope.Options{DataClassification: "internal", CorrelationID: correlationID})
	if err != nil {
		return nil, nil, layout, err
	}
	var value []byte
	if s.c.cfg.SigningKey != nil {
		value, err = signing.Sign(aenv, s.c.cfg.SigningKey, layout, signing.ScopeV2)
	} else {
		value, err = envelope.Encode(aenv, layout)
	}
	return aenv, value, layout, err
}

// flushRefusals writes the one audit record of the refusals held so far, then commits each
// of them. When the record cannot be written, every partition holding one is rewound to its
// first held message (they are refused - and audited - again) and the error returned.
func (s *Subscription) flushRefusals(ctx context.Context) error {
	if len(s.refused) == 0 {
		return nil
	}
	held := s.refused
	s.refused, s.refusedBytes = nil, 0
	entries := make([]refusalEntry, len(held))
	for i, h := range held {
		entries[i] = h.entry
	}
	rr := newRefusalRecord(held[0].env, entries, s.level, s.cfg.Principal, s.cfg.Group, time.Now())
	var err error
	if !s.auditReady {
		if err = s.c.EnsureTopic(ctx, s.auditTopic); err == nil {
			s.auditReady = true
		}
	}
	if err == nil {
		var aenv *envelope.Envelope
		var value []byte
		var layout envelope.Layout
		aenv, value, layout, err = s.encodeAudit(rr, rr.MessageID)
		if err == nil {
			err = s.c.cl.ProduceSync(ctx, NewRecord(s.auditTopic, aenv, layout, value, []byte(rr.MessageID))).FirstErr()
		}
	}
	if err != nil {
		first := map[int32]int64{}
		for _, h := range held {
			if o, ok := first[h.m.Record.Partition]; !ok || h.m.Record.Offset < o {
				first[h.m.Record.Partition] = h.m.Record.Offset
			}
		}
		rewind := map[int32]kgo.EpochOffset{}
		parts := make([]int32, 0, len(first))
		for p, o := range first {
			parts = append(parts, p)
			rewind[p] = kgo.EpochOffset{Epoch: -1, Offset: o}
		}
		s.forget(parts)
		s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{s.topic: rewind})
		others := ""
		if len(held) > 1 {
			others = " (and " + strconv.Itoa(len(held)-1) + " other refused messages)"
		}
		return (&prismerr.Error{Code: "delivery_audit_failed", What: "the refusal audit record of " + rr.Classification +
			" message " + rr.MessageID + others + " on " + quote(s.topic) + " could not be written to " + quote(s.auditTopic) +
			", so the refused messages were not committed and will be fetched (and refused) again: " + err.Error(),
			Hint: "check that the audit topic is writable"}).Wrap(err)
	}
	for _, h := range held {
		if err := h.m.Ack(ctx); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.stats.RefusalRecords++
	s.mu.Unlock()
	return nil
}

// audit writes the delivery's audit record before the application sees the message; when
// that fails, the partition is rewound to the message so it is delivered (and audited) again.
func (s *Subscription) audit(ctx context.Context, env *envelope.Envelope, class string, rec *kgo.Record) error {
	ar := newAuditRecord(env, class, s.cfg.Principal, s.cfg.Group, refOf(rec), time.Now())
	// signed with the client's key, in its layout, keyed by the delivered message's id (as in Python)
	aenv, value, layout, err := s.encodeAudit(ar, ar.MessageID)
	if err == nil {
		err = s.c.cl.ProduceSync(ctx, NewRecord(s.auditTopic, aenv, layout, value, []byte(ar.MessageID))).FirstErr()
	}
	if err != nil {
		s.forget([]int32{rec.Partition})
		s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{rec.Topic: {rec.Partition: {Epoch: -1, Offset: rec.Offset}}})
		return (&prismerr.Error{Code: "delivery_audit_failed", What: "the audit record of " + class + " message " + ar.MessageID +
			" could not be written to " + quote(s.auditTopic) + ", so the message was not delivered and will be fetched again: " + err.Error(),
			Hint: "check that the audit topic is writable"}).Wrap(err)
	}
	s.mu.Lock()
	s.stats.Audited++
	s.mu.Unlock()
	return nil
}

// TypedSubscription delivers JSON payloads decoded into T.
type TypedSubscription[T any] struct{ *Subscription }

// SubscribeTyped subscribes to topic and decodes each payload as JSON into a T.
func SubscribeTyped[T any](ctx context.Context, c *Client, topic string, cfg SubscribeConfig) (*TypedSubscription[T], error) {
	s, err := c.Subscribe(ctx, topic, cfg)
	if err != nil {
		return nil, err
	}
	return &TypedSubscription[T]{s}, nil
}

// Next returns the next payload as a T together with its message. A payload that is not a
// valid T is returned as a typed payload_error with the message (Ack to skip it).
func (s *TypedSubscription[T]) Next(ctx context.Context) (T, *Message, error) {
	var zero T
	m, err := s.Subscription.Next(ctx)
	if err != nil {
		return zero, m, err
	}
	v, err := envelope.JSONPayload[T](m.Envelope)
	return v, m, err
}
