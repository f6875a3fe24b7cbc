// The reads: the gates an execution needs and past executions (durations, the latest of a PR).

package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
)

// ExecutionGates asks what plan execution id needs before its apply: the gates it requires
// under the server's policy, satisfied or not, and the other PRs' claims on its stacks; nil,
// nil when disabled.
func (c *Client) ExecutionGates(ctx context.Context, id string) (*api.ExecutionGates, error) {
	if !c.Enabled() {
		return nil, nil
	}
	body, err := c.call(ctx, "ExecutionGates", true, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionGates(ctx, id)
	})
	if err != nil {
		return nil, err
	}
	var out api.ExecutionGates
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("ExecutionGates: malformed answer: %w", err)
	}
	return &out, nil
}

// Bounds of the reads of past executions (LastDurations, LatestExecution).
const (
	// HistoryBudget bounds one LastDurations or LatestExecution call as a whole: its list
	// requests and execution reads, retries included.
	HistoryBudget = 4 * time.Second
	// MaxDurationExecutions caps the finished plan executions LastDurations reads.
	MaxDurationExecutions = 5
	// historyPage is how many executions one list request asks for.
	historyPage = 50
	// maxHistoryPages caps the list pages LatestExecution walks looking for its op.
	maxHistoryPages = 4
	// maxDurationMS is the longest duration, in milliseconds, a time.Duration holds.
	maxDurationMS = math.MaxInt64 / int64(time.Millisecond)
)

// ErrNoExecution says the server has no execution of the PR, environment and op asked for
// (LatestExecution).
var ErrNoExecution = errors.New("no such execution on the server")

// LastDurations returns, per stack (its root-relative path, as the runner reports it), how
// long its most recent ended run took in a finished plan execution of repo's environment, any
// PR (repo empty: the server's choice for the principal). It lists the newest executions and
// reads the finished plans among them, newest first, until every stack of want (nil: every
// stack they name) has a duration or MaxDurationExecutions were read: an older plan fills only
// the stacks the newer ones left without one. It is best-effort: within HistoryBudget and
// through the breaker like every read, and a stack missing from the map is unknown. A disabled
// client returns nil, nil without a request. On an error the map holds what was read before it
// (possibly nothing).
func (c *Client) LastDurations(ctx context.Context, repo, environment string, want []string) (map[string]time.Duration, error) {
	const op = "LastDurations"
	if !c.Enabled() {
		return nil, nil
	}
	if environment == "" {
		return nil, fmt.Errorf("%s: the environment is required", op)
	}
	ctx, cancel := context.WithTimeout(ctx, c.historyBudget)
	defer cancel()
	list, err := c.executionsList(ctx, op, &api.ExecutionsListParams{Repo: repo, Environment: environment, Limit: new(int(historyPage))})
	if err != nil {
		return nil, err
	}
	out, seen, read := map[string]time.Duration{}, map[string]bool{}, 0
	for _, x := range list {
		if x.Op != api.ExecutionOpPlan || x.Status == api.ExecutionStatusRunning || x.Environment != environment {
			continue
		}
		if read == MaxDurationExecutions || read > 0 && known(out, seen, want) {
			break
		}
		full, err := c.executionGet(ctx, op, x.ExecutionID)
		if isNotFound(err) {
			continue // removed since it was listed
		}
		if err != nil {
			return out, err
		}
		read++
		for _, st := range full.Stacks {
			seen[st.Stack] = true
			if _, known := out[st.Stack]; !known && st.DurationMS != nil && *st.DurationMS >= 0 && *st.DurationMS <= maxDurationMS {
				out[st.Stack] = time.Duration(*st.DurationMS) * time.Millisecond
			}
		}
	}
	return out, nil
}

// known reports whether out has a duration for every stack of want, or with want nil for every
// stack seen.
func known(out map[string]time.Duration, seen map[string]bool, want []string) bool {
	if want == nil {
		return len(out) == len(seen)
	}
	for _, w := range want {
		if _, ok := out[w]; !ok {
			return false
		}
	}
	return true
}

// LatestExecution returns the newest execution of pr in repo's environment (repo empty: the
// server's choice for the principal) whose op is op (plan or apply), whatever its status, with
// its stacks and edges: the first of its op in the server's list of the PR's executions,
// newest first, among the newest few hundred. An error wrapping ErrNoExecution says there is
// none; a disabled client returns ErrDisabled. Within HistoryBudget, through the breaker.
func (c *Client) LatestExecution(ctx context.Context, repo, environment string, pr int, op string) (*api.Execution, error) {
	const name = "LatestExecution"
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	switch {
	case environment == "":
		return nil, fmt.Errorf("%s: the environment is required", name)
	case pr <= 0:
		return nil, fmt.Errorf("%s: pr %d is not a pull request number", name, pr)
	case op != string(api.ExecutionOpPlan) && op != string(api.ExecutionOpApply):
		return nil, fmt.Errorf("%s: op %q is neither plan nor apply", name, op)
	}
	ctx, cancel := context.WithTimeout(ctx, c.historyBudget)
	defer cancel()
	none := fmt.Errorf("%w: no %s execution of PR %d in environment %q", ErrNoExecution, op, pr, environment)
	if op == string(api.ExecutionOpPlan) {
		// The latest plan is the one the server received last, never the one whose runner's
		// clock says so: a plan dated ahead must not hide the plans that came after it.
		x, err := c.LatestPlan(ctx, repo, environment, pr)
		if isNotFound(err) {
			return nil, none
		}
		return x, err
	}
	params := &api.ExecutionsListParams{Repo: repo, Environment: environment, Pr: pr, Limit: new(int(historyPage))}
	for range maxHistoryPages {
		list, err := c.executionsList(ctx, name, params)
		if err != nil {
			return nil, err
		}
		for _, x := range list {
			if string(x.Op) == op && x.Environment == environment && x.PR == pr {
				full, err := c.executionGet(ctx, name, x.ExecutionID)
				if isNotFound(err) {
					return nil, none // removed since it was listed
				}
				return full, err
			}
		}
		if len(list) < historyPage {
			break
		}
		last := list[len(list)-1]
		params.Before, params.BeforeID = &last.StartedAt, &last.ExecutionID
	}
	return nil, none
}

// LatestPlan returns pr's plan in repo's environment that the server received last (GET
// /plans/latest), with its stacks: the plan the gate decides over and an approval names. A PR
// without a plan is an APIError of status 404; ErrDisabled when no server is configured.
func (c *Client) LatestPlan(ctx context.Context, repo, environment string, pr int) (*api.Execution, error) {
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	params := &api.LatestPlanParams{Repo: repo, Environment: environment, Pr: pr}
	return readJSON[api.Execution](ctx, c, "LatestPlan", MaxExecutionBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.LatestPlan(ctx, params)
	})
}

// executionsList reads one page of executions for the read op.
func (c *Client) executionsList(ctx context.Context, op string, params *api.ExecutionsListParams) ([]api.Execution, error) {
	body, err := c.call(ctx, op, true, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionsList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	var out []api.Execution
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s: malformed list of executions: %w", op, err)
	}
	return out, nil
}

// executionGet reads execution id with its stacks and edges for the read op.
func (c *Client) executionGet(ctx context.Context, op, id string) (*api.Execution, error) {
	body, err := c.callSized(ctx, op, true, 0, MaxExecutionBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionGet(ctx, id)
	})
	if err != nil {
		return nil, err
	}
	var out api.Execution
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s: malformed execution %q: %w", op, id, err)
	}
	return &out, nil
}

// isNotFound says err is the server's answer that what was asked for does not exist.
func isNotFound(err error) bool {
	var ae *APIError
	return errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound
}

// ExecutionsList returns one page of executions as params select them, newest first (an
// operator's listing); ErrDisabled when no server is configured.
func (c *Client) ExecutionsList(ctx context.Context, params *api.ExecutionsListParams) ([]api.Execution, error) {
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	list, err := readJSON[[]api.Execution](ctx, c, "ExecutionsList", MaxResponseBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionsList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	return *list, nil
}

// ExecutionGet returns execution id with its stacks and edges; ErrDisabled when no server is
// configured.
func (c *Client) ExecutionGet(ctx context.Context, id string) (*api.Execution, error) {
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	return readJSON[api.Execution](ctx, c, "ExecutionGet", MaxExecutionBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.ExecutionGet(ctx, id)
	})
}

// GatesList returns the gates of a PR's plans in an environment, as params select them;
// ErrDisabled when no server is configured.
func (c *Client) GatesList(ctx context.Context, params *api.GatesListParams) ([]api.Gate, error) {
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	gates, err := readJSON[[]api.Gate](ctx, c, "GatesList", MaxResponseBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.GatesList(ctx, params)
	})
	if err != nil {
		return nil, err
	}
	return *gates, nil
}

// LogRead returns the bytes of a stack's log of execution id from params' offset: of the
// generation params name, or of the latest one when latest is set; ErrDisabled when no server
// is configured.
func (c *Client) LogRead(ctx context.Context, id string, params api.LogReadParams, latest bool) (*api.LogSlice, error) {
	if !c.Enabled() {
		return nil, ErrDisabled
	}
	var editors []api.RequestEditorFn
	if latest {
		// The generated client always sends generation (0 when unset); the latest generation is
		// asked for by leaving it out.
		editors = append(editors, func(_ context.Context, req *http.Request) error {
			q := req.URL.Query()
			q.Del("generation")
			req.URL.RawQuery = q.Encode()
			return nil
		})
	}
	return readJSON[api.LogSlice](ctx, c, "LogRead", MaxResponseBytes, func(ctx context.Context) (*http.Response, error) {
		return c.api.LogRead(ctx, id, &params, editors...)
	})
}

// readJSON sends one idempotent read (an answer of up to maxBody bytes) and decodes its JSON
// answer.
func readJSON[T any](ctx context.Context, c *Client, op string, maxBody int, send func(context.Context) (*http.Response, error)) (*T, error) {
	op = callOptionsOf(ctx).opName(op)
	body, err := c.callSized(ctx, op, true, 0, maxBody, send)
	if err != nil {
		return nil, err
	}
	var out T
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("%s: malformed answer: %w", op, err)
	}
	return &out, nil
}
