package notify

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Event is one thing that happened, as every target receives it.
type Event struct {
	// Name is one of Events.
	Name string
	// Repo, Environment, PR (0: none) and ExecutionID say what it is about; URL is the
	// execution's page.
	Repo, Environment, ExecutionID string
	PR                             int
	URL                            string
	// Summary is one line for people (a Slack message's text).
	Summary string
	// Data is the event's own fields (GateWaitingData, ...).
	Data any
}

// Gate is a gate in an event: its class and target glob and the stacks it covers.
type Gate struct {
	Class  string   `json:"class"`
	Target string   `json:"target"`
	Stacks []string `json:"stacks"`
}

// GateWaitingData are the fields of gate.waiting: the gates the PR's latest plan needs that are
// not satisfied, and the command that approves each.
type GateWaitingData struct {
	SHA      string   `json:"sha"`
	Gates    []Gate   `json:"gates"`
	Commands []string `json:"approve_commands"`
}

// GateApprovedData are the fields of gate.approved.
type GateApprovedData struct {
	Gate   Gate   `json:"gate"`
	By     string `json:"by"`
	Plan   string `json:"plan"`
	Reason string `json:"reason"`
}

// ApplyData are the fields of apply.succeeded, apply.failed and apply.denied.
type ApplyData struct {
	SHA    string `json:"sha"`
	Status string `json:"status"`
	Error  string `json:"error,omitempty"`
	// Plan is the plan execution the gate decided over (when it allowed the apply).
	Plan string `json:"plan,omitempty"`
}

// DriftData are the fields of drift.detected and drift.resolved: the stacks whose drift changed
// that way in one drift execution (at most MaxDriftStacks named; Count has them all).
type DriftData struct {
	Stacks    []string `json:"stacks"`
	Count     int      `json:"count"`
	Truncated bool     `json:"truncated,omitempty"`
}

// MaxDriftStacks bounds the stacks one drift event names.
const MaxDriftStacks = 100

// StaleData are the fields of execution.stale.
type StaleData struct {
	Op    string `json:"op"`
	Error string `json:"error"`
	// Silence is how long the server had heard nothing of the runner.
	Silence string `json:"silence"`
}

// payload is the JSON body of a json target.
type payload struct {
	Event       string    `json:"event"`
	Delivery    string    `json:"delivery"`
	At          time.Time `json:"at"`
	Repository  string    `json:"repository"`
	Environment string    `json:"environment"`
	PR          int       `json:"pr,omitempty"`
	ExecutionID string    `json:"execution_id"`
	URL         string    `json:"url,omitempty"`
	Summary     string    `json:"summary"`
	Data        any       `json:"data"`
}

// Render returns the request body of ev for a target of format, with delivery id delivery.
func Render(format string, ev Event, delivery string, at time.Time) ([]byte, error) {
	if format == FormatSlack {
		return renderSlack(ev)
	}
	return marshal(payload{Event: ev.Name, Delivery: delivery, At: at.UTC(), Repository: ev.Repo, Environment: ev.Environment,
		PR: ev.PR, ExecutionID: ev.ExecutionID, URL: ev.URL, Summary: ev.Summary, Data: ev.Data})
}

// slackEscape escapes the three characters Slack's mrkdwn gives a meaning.
func slackEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// renderSlack is an incoming webhook's message: the summary as text (the notification's), and
// blocks: the summary with the page's link, then what it is about.
func renderSlack(ev Event) ([]byte, error) {
	head := "*" + slackEscape(ev.Summary) + "*"
	if ev.URL != "" {
		head += "\n<" + slackEscape(ev.URL) + "|Open in tfstackplan>"
	}
	ctx := fmt.Sprintf("%s · %s · %s", ev.Name, slackEscape(ev.Repo), slackEscape(ev.Environment))
	if ev.PR != 0 {
		ctx += fmt.Sprintf(" · PR #%d", ev.PR)
	}
	ctx += " · execution `" + slackEscape(ev.ExecutionID) + "`"
	type text struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type block struct {
		Type     string `json:"type"`
		Text     *text  `json:"text,omitempty"`
		Elements []text `json:"elements,omitempty"`
	}
	msg := struct {
		Text   string  `json:"text"`
		Blocks []block `json:"blocks"`
	}{Text: ev.Summary, Blocks: []block{
		{Type: "section", Text: &text{Type: "mrkdwn", Text: head}},
		{Type: "context", Elements: []text{{Type: "mrkdwn", Text: ctx}}},
	}}
	if extra := slackDetail(ev); extra != "" {
		msg.Blocks = append(msg.Blocks[:1], block{Type: "section", Text: &text{Type: "mrkdwn", Text: extra}}, msg.Blocks[1])
	}
	return marshal(msg)
}

// marshal is json.Marshal without the escaping of <, > and & (a Slack link is <url|text>).
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

// slackDetail is the event's detail for a Slack message (Slack caps a text at 3000 characters).
func slackDetail(ev Event) string {
	var b strings.Builder
	switch d := ev.Data.(type) {
	case GateWaitingData:
		for i, g := range d.Gates {
			fmt.Fprintf(&b, "• %s on `%s`: %s\n", g.Class, slackEscape(g.Target), slackEscape(strings.Join(g.Stacks, ", ")))
			if i < len(d.Commands) {
				fmt.Fprintf(&b, "  `%s`\n", slackEscape(d.Commands[i]))
			}
		}
	case GateApprovedData:
		fmt.Fprintf(&b, "%s on `%s` by %s: %s", d.Gate.Class, slackEscape(d.Gate.Target), slackEscape(d.By), slackEscape(d.Reason))
	case DriftData:
		fmt.Fprintf(&b, "%s", slackEscape(strings.Join(d.Stacks, ", ")))
	case ApplyData:
		if d.Error != "" {
			b.WriteString(slackEscape(d.Error))
		}
	}
	s := b.String()
	if len(s) > 2900 {
		s = s[:2900] + "…"
	}
	return strings.TrimSpace(s)
}

// NewDeliveryID returns a random delivery id (the UUID form GitHub's delivery ids have).
func NewDeliveryID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// Deliveries renders ev for every target that wants it: the outbox rows to write, due at now.
func Deliveries(targets []Target, ev Event, now time.Time) ([]store.Delivery, error) {
	var out []store.Delivery
	for _, t := range targets {
		if !t.Wants(ev.Name, ev.Repo, ev.Environment) {
			continue
		}
		id := NewDeliveryID()
		body, err := Render(t.Format, ev, id, now)
		if err != nil {
			return nil, fmt.Errorf("notify %s: %s: %w", t.Name, ev.Name, err)
		}
		out = append(out, store.Delivery{Delivery: id, Target: t.Name, Event: ev.Name, Repo: ev.Repo, Environment: ev.Environment,
			PR: ev.PR, ExecutionID: ev.ExecutionID, Body: body, CreatedAt: now, NextAt: now})
	}
	return out, nil
}
