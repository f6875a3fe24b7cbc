package job

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tfstackplan/tfstackplan/events"
	"github.com/tfstackplan/tfstackplan/internal/api"
)

// memServer is a small in-memory control plane built on the generated strict server
// interface, for round-trip tests of the client. It keeps what it is sent and answers reads
// from it; the real server (internal/server) has the domain rules.
type memServer struct {
	mu     sync.Mutex
	inits  map[string]api.Init
	phases []api.PhaseEvent
	// phaseBatches counts Phases requests
	phaseBatches int
	// refusePhases, when set, is the status Phases answers (a server without the operation).
	refusePhases int
	updates      []api.Update
	logs         []api.LogChunk
	finals       []api.Finalize
	heartbeats   []api.Heartbeat
	// failFinalize, while above 0, makes Finalize drop the connection (and counts down).
	failFinalize int
	checks       []api.GateCheck
	revokes      []api.GateRevoke
	claims       []api.Claim
	released     []api.ClaimsRelease
	overrides    []api.ChecksOverride
	cancels      map[string]string
	satisfied    []api.GatesSatisfy
	releases     []api.GrantsRelease
	requester    string
	auth         []string // Authorization headers seen
	// execGates, when it has the execution, is ExecutionGates' answer; without it the answer
	// is that of a server whose policy has no such environment.
	execGates map[string]api.ExecutionGates

	// updateBatches counts Updates requests.
	updateBatches int
	// refuseUpdates, when not 0, is the HTTP status Updates answers with, as a server without
	// the operation does (an older tfstackplan answers a runner 403, an admin 404).
	refuseUpdates int
	// requests counts requests by path below /api/v1.
	requests map[string]int
	// arrivals lists the paths below /api/v1 in the order the requests came, with "answered
	// /init" where Init was answered.
	arrivals []string
	// initHold, when set, holds Init's answer until it is closed (or 10 s passed).
	initHold <-chan struct{}
}

func newMemServer() *memServer {
	return &memServer{inits: map[string]api.Init{}, cancels: map[string]string{}, requester: "sa-apply@example.iam", requests: map[string]int{}}
}

// start serves m on a loopback httptest server under /api/v1.
func (m *memServer) start(t testing.TB) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	h := api.HandlerWithOptions(api.NewStrictHandler(m, nil), api.StdHTTPServerOptions{BaseURL: "/api/v1", BaseRouter: mux})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.auth = append(m.auth, r.Header.Get("Authorization"))
		m.requests[strings.TrimPrefix(r.URL.Path, "/api/v1")]++
		m.arrivals = append(m.arrivals, strings.TrimPrefix(r.URL.Path, "/api/v1"))
		m.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func (m *memServer) ack(id string) api.Ack {
	if r, ok := m.cancels[id]; ok {
		return api.Ack{Cancel: true, Reason: r}
	}
	return api.Ack{}
}

func (m *memServer) Init(ctx context.Context, r api.InitRequestObject) (api.InitResponseObject, error) {
	m.mu.Lock()
	hold := m.initHold
	m.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done(): // the client gave up on this attempt: it never sees an answer
			m.mu.Lock()
			m.arrivals = append(m.arrivals, "abandoned /init")
			m.mu.Unlock()
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.inits[r.Body.ExecutionID]; !ok {
		m.inits[r.Body.ExecutionID] = *r.Body
	}
	m.arrivals = append(m.arrivals, "answered /init")
	return api.Init200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) Phase(_ context.Context, r api.PhaseRequestObject) (api.PhaseResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.phases = append(m.phases, *r.Body)
	return api.Phase200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) Phases(_ context.Context, r api.PhasesRequestObject) (api.PhasesResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refusePhases != 0 {
		return api.PhasesdefaultJSONResponse{StatusCode: m.refusePhases, Body: api.Error{Message: http.StatusText(m.refusePhases)}}, nil
	}
	m.phases = append(m.phases, r.Body.Phases...)
	m.phaseBatches++
	return api.Phases200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.Phases[0].ExecutionID))}, nil
}

// invalidUpdate is the real server's answer to an update without a stack.
var invalidUpdate = api.Error{Code: "INVALID_ARGUMENT", Message: "stack is required"}

func (m *memServer) Update(_ context.Context, r api.UpdateRequestObject) (api.UpdateResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r.Body.Stack == "" {
		return api.UpdatedefaultJSONResponse{StatusCode: http.StatusBadRequest, Body: invalidUpdate}, nil
	}
	m.updates = append(m.updates, *r.Body)
	return api.Update200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) Updates(_ context.Context, r api.UpdatesRequestObject) (api.UpdatesResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.refuseUpdates != 0 {
		return api.UpdatesdefaultJSONResponse{StatusCode: m.refuseUpdates, Body: api.Error{Message: http.StatusText(m.refuseUpdates)}}, nil
	}
	for _, u := range r.Body.Updates {
		if u.Stack == "" { // one invalid update refuses the batch
			return api.UpdatesdefaultJSONResponse{StatusCode: http.StatusBadRequest, Body: invalidUpdate}, nil
		}
	}
	m.updates = append(m.updates, r.Body.Updates...)
	m.updateBatches++
	return api.Updates200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.Updates[0].ExecutionID))}, nil
}

func (m *memServer) LogChunk(_ context.Context, r api.LogChunkRequestObject) (api.LogChunkResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.logs = append(m.logs, *r.Body)
	return api.LogChunk200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) Heartbeat(_ context.Context, r api.HeartbeatRequestObject) (api.HeartbeatResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.heartbeats = append(m.heartbeats, *r.Body)
	return api.Heartbeat200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) Finalize(_ context.Context, r api.FinalizeRequestObject) (api.FinalizeResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failFinalize > 0 {
		m.failFinalize--
		panic(http.ErrAbortHandler) // the server went away: the client sees the connection end
	}
	m.finals = append(m.finals, *r.Body)
	in := m.inits[r.Body.ExecutionID]
	for _, s := range r.Body.Stacks {
		m.claims = append(m.claims, api.Claim{Environment: in.Environment, Stack: s.Stack, PR: in.PR, ExecutionID: in.ExecutionID, SHA: in.SHA})
	}
	return api.Finalize200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(r.Body.ExecutionID))}, nil
}

func (m *memServer) GateCheck(_ context.Context, r api.GateCheckRequestObject) (api.GateCheckResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.checks = append(m.checks, *r.Body)
	for _, f := range m.finals {
		if in := m.inits[f.ExecutionID]; in.PR == r.Body.PR && in.Environment == r.Body.Environment {
			return api.GateCheck200JSONResponse{Requester: m.requester}, nil
		}
	}
	return api.GateCheckdefaultJSONResponse{StatusCode: http.StatusPreconditionFailed, Body: api.Error{Code: "FAILED_PRECONDITION", Message: "no finalized plan"}}, nil
}

func (m *memServer) GateRevoke(_ context.Context, r api.GateRevokeRequestObject) (api.GateRevokeResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.revokes = append(m.revokes, *r.Body)
	return api.GateRevoke200JSONResponse{}, nil
}

func (m *memServer) ClaimsList(_ context.Context, r api.ClaimsListRequestObject) (api.ClaimsListResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := api.ClaimsList200JSONResponse{}
	for _, c := range m.claims {
		if r.Params.Environment == "" || c.Environment == r.Params.Environment {
			out = append(out, c)
		}
	}
	return out, nil
}

func (m *memServer) ClaimsRelease(_ context.Context, r api.ClaimsReleaseRequestObject) (api.ClaimsReleaseResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.released = append(m.released, *r.Body)
	kept := m.claims[:0]
	for _, c := range m.claims {
		if c.Environment == r.Body.Environment && c.PR == r.Body.PR && (r.Body.Stack == "" || r.Body.Stack == c.Stack) {
			continue
		}
		kept = append(kept, c)
	}
	m.claims = kept
	return api.ClaimsRelease200JSONResponse{}, nil
}

func (m *memServer) ChecksList(context.Context, api.ChecksListRequestObject) (api.ChecksListResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := api.ChecksList200JSONResponse{}
	for _, o := range m.overrides {
		out = append(out, api.Check{PR: o.PR, Environment: o.Environment, Check: o.Check, Conclusion: string(o.Conclusion), Overridden: true, Reason: o.Reason})
	}
	return out, nil
}

func (m *memServer) AdminChecksOverride(_ context.Context, r api.AdminChecksOverrideRequestObject) (api.AdminChecksOverrideResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.overrides = append(m.overrides, *r.Body)
	return api.AdminChecksOverride200JSONResponse{}, nil
}

func (m *memServer) AdminExecutionsCancel(_ context.Context, r api.AdminExecutionsCancelRequestObject) (api.AdminExecutionsCancelResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cancels[r.Body.ExecutionID] = r.Body.Reason
	return api.AdminExecutionsCancel200JSONResponse{}, nil
}

func (m *memServer) AdminGatesSatisfy(_ context.Context, r api.AdminGatesSatisfyRequestObject) (api.AdminGatesSatisfyResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.satisfied = append(m.satisfied, *r.Body)
	return api.AdminGatesSatisfy200JSONResponse{}, nil
}

func (m *memServer) AdminGrantsRelease(_ context.Context, r api.AdminGrantsReleaseRequestObject) (api.AdminGrantsReleaseResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.releases = append(m.releases, *r.Body)
	return api.AdminGrantsRelease200JSONResponse{}, nil
}

func (m *memServer) ExecutionsList(context.Context, api.ExecutionsListRequestObject) (api.ExecutionsListResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := api.ExecutionsList200JSONResponse{}
	for _, in := range m.inits {
		out = append(out, api.Execution{ExecutionID: in.ExecutionID, Environment: in.Environment, Op: api.ExecutionOp(in.Op), Status: api.ExecutionStatusRunning, PR: in.PR})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ExecutionID < out[j].ExecutionID })
	return out, nil
}

func (m *memServer) ExecutionGet(_ context.Context, r api.ExecutionGetRequestObject) (api.ExecutionGetResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.inits[r.Id]
	if !ok {
		return api.ExecutionGetdefaultJSONResponse{StatusCode: 404, Body: api.Error{Code: "NOT_FOUND", Message: "no execution " + r.Id}}, nil
	}
	ex := api.Execution{ExecutionID: in.ExecutionID, Environment: in.Environment, Op: api.ExecutionOp(in.Op), Status: api.ExecutionStatusRunning, Edges: in.Edges}
	for _, s := range in.Stacks {
		ex.Stacks = append(ex.Stacks, api.StackState{Stack: s, Status: events.StackPending})
	}
	return api.ExecutionGet200JSONResponse(ex), nil
}

func (m *memServer) ExecutionGates(_ context.Context, r api.ExecutionGatesRequestObject) (api.ExecutionGatesResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if x, ok := m.execGates[r.Id]; ok {
		return api.ExecutionGates200JSONResponse(x), nil
	}
	in, ok := m.inits[r.Id]
	if !ok {
		return api.ExecutionGatesdefaultJSONResponse{StatusCode: 404, Body: api.Error{Code: "NOT_FOUND", Message: "no execution " + r.Id}}, nil
	}
	return api.ExecutionGates200JSONResponse{ExecutionID: in.ExecutionID, Repo: in.Repo, Environment: in.Environment, PR: in.PR,
		Gates: []api.Gate{}, Conflicts: []api.ClaimConflict{}}, nil
}

func (m *memServer) LogRead(_ context.Context, r api.LogReadRequestObject) (api.LogReadResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := api.LogSlice{Stack: r.Params.Stack}
	for _, l := range m.logs {
		if l.ExecutionID == r.Id && l.Stack == r.Params.Stack && l.Offset == out.NextOffset {
			out.Data = append(out.Data, l.Data...)
			out.NextOffset += int64(len(l.Data))
		}
	}
	return api.LogRead200JSONResponse(out), nil
}

func (m *memServer) GatesList(context.Context, api.GatesListRequestObject) (api.GatesListResponseObject, error) {
	return api.GatesList200JSONResponse{}, nil
}

func (m *memServer) GrantsList(context.Context, api.GrantsListRequestObject) (api.GrantsListResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := api.GrantsList200JSONResponse{}
	for i, s := range m.satisfied {
		out = append(out, api.Grant{ID: int64(i + 1), Environment: s.Environment, PR: s.PR, Class: s.Class, Target: s.Target, Reason: s.Reason, GrantedAt: time.Unix(0, 0).UTC()})
	}
	return out, nil
}

func (m *memServer) AuditList(context.Context, api.AuditListRequestObject) (api.AuditListResponseObject, error) {
	return api.AuditList200JSONResponse{}, nil
}

func (m *memServer) DriftList(context.Context, api.DriftListRequestObject) (api.DriftListResponseObject, error) {
	return api.DriftList200JSONResponse{}, nil
}

func (m *memServer) NotificationsList(context.Context, api.NotificationsListRequestObject) (api.NotificationsListResponseObject, error) {
	return api.NotificationsList200JSONResponse{}, nil
}

// LatestPlan answers as a server that never received a plan for the PR.
func (m *memServer) LatestPlan(_ context.Context, r api.LatestPlanRequestObject) (api.LatestPlanResponseObject, error) {
	return api.LatestPlandefaultJSONResponse{StatusCode: 404, Body: api.Error{Code: "NOT_FOUND", Message: "no plan"}}, nil
}

func (m *memServer) Health(context.Context, api.HealthRequestObject) (api.HealthResponseObject, error) {
	return api.Health200JSONResponse{Status: "ok", Store: "memory"}, nil
}

func (m *memServer) LogChunks(_ context.Context, r api.LogChunksRequestObject) (api.LogChunksResponseObject, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.logs = append(m.logs, r.Body.Chunks...)
	id := ""
	if len(r.Body.Chunks) > 0 {
		id = r.Body.Chunks[0].ExecutionID
	}
	return api.LogChunks200JSONResponse{AckJSONResponse: api.AckJSONResponse(m.ack(id))}, nil
}
