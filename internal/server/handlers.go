package server

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/buildinfo"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
	"github.com/tfstackplan/tfstackplan/internal/server/throttle"
	"github.com/tfstackplan/tfstackplan/internal/server/web"
)

// handlers implements the generated strict server interface over the service.
type handlers struct {
	errorMapper
	svc     *service.Service
	metrics *serverMetrics

	pingMu  sync.Mutex
	pinging *pingCall
}

// pingCall is one store ping that every health and readiness check arriving while it runs
// shares: a flood of those unauthenticated checks costs the database one query at a time.
type pingCall struct {
	done chan struct{}
	err  error
}

// ping reports whether the store answers (within 3s).
func (h *handlers) ping(ctx context.Context) error {
	h.pingMu.Lock()
	c := h.pinging
	if c == nil {
		c = &pingCall{done: make(chan struct{})}
		h.pinging = c
		go func() {
			pctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			c.err = h.svc.Ping(pctx)
			cancel()
			h.pingMu.Lock()
			h.pinging = nil
			h.pingMu.Unlock()
			close(c.done)
		}()
	}
	h.pingMu.Unlock()
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

var _ api.StrictServerInterface = (*handlers)(nil)

// caller is the request's principal as the service's rules need it.
func caller(ctx context.Context) service.Caller {
	p, _ := auth.From(ctx)
	return web.CallerOf(p)
}

type queryKey struct{}

// writerKey holds the request's http.ResponseWriter in its context, for the headers an error
// of a strict handler's answer needs.
type writerKey struct{}

// retryAfter gives the answer to a request refused for a quota (service.QuotaError) its
// Retry-After header.
func retryAfter(ctx context.Context, err error) {
	qe := (*service.QuotaError)(nil)
	if !errors.As(err, &qe) {
		return
	}
	if w, ok := ctx.Value(writerKey{}).(http.ResponseWriter); ok {
		w.Header().Set("Retry-After", throttle.RetryAfter(qe.Wait))
	}
}

func queryOf(ctx context.Context) url.Values {
	q, _ := ctx.Value(queryKey{}).(url.Values)
	return q
}

func (h *handlers) event(kind string, err error) {
	if err == nil {
		h.metrics.events.WithLabelValues(kind).Inc()
	}
}

func (h *handlers) Init(ctx context.Context, r api.InitRequestObject) (api.InitResponseObject, error) {
	ack, err := h.svc.Init(ctx, caller(ctx), r.Body)
	h.event("init", err)
	if err != nil {
		retryAfter(ctx, err)
		return api.InitdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Init200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Phase(ctx context.Context, r api.PhaseRequestObject) (api.PhaseResponseObject, error) {
	ack, err := h.svc.Phase(ctx, caller(ctx), r.Body)
	h.event("phase", err)
	if err != nil {
		return api.PhasedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Phase200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Phases(ctx context.Context, r api.PhasesRequestObject) (api.PhasesResponseObject, error) {
	ack, err := h.svc.Phases(ctx, caller(ctx), r.Body.Phases)
	if err != nil {
		return api.PhasesdefaultJSONResponse(h.errResp(err)), nil
	}
	h.metrics.events.WithLabelValues("phase").Add(float64(len(r.Body.Phases)))
	return api.Phases200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Update(ctx context.Context, r api.UpdateRequestObject) (api.UpdateResponseObject, error) {
	ack, err := h.svc.Update(ctx, caller(ctx), r.Body)
	h.event("update", err)
	if err != nil {
		return api.UpdatedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Update200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Updates(ctx context.Context, r api.UpdatesRequestObject) (api.UpdatesResponseObject, error) {
	ack, err := h.svc.Updates(ctx, caller(ctx), r.Body.Updates)
	if err != nil {
		return api.UpdatesdefaultJSONResponse(h.errResp(err)), nil
	}
	h.metrics.events.WithLabelValues("update").Add(float64(len(r.Body.Updates)))
	return api.Updates200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Heartbeat(ctx context.Context, r api.HeartbeatRequestObject) (api.HeartbeatResponseObject, error) {
	ack, err := h.svc.Heartbeat(ctx, caller(ctx), r.Body)
	h.event("heartbeat", err)
	if err != nil {
		return api.HeartbeatdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Heartbeat200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) LogChunk(ctx context.Context, r api.LogChunkRequestObject) (api.LogChunkResponseObject, error) {
	ack, err := h.svc.LogChunk(ctx, caller(ctx), r.Body)
	if err != nil {
		retryAfter(ctx, err)
		return api.LogChunkdefaultJSONResponse(h.errResp(err)), nil
	}
	h.metrics.chunks.Inc()
	h.metrics.logBytes.Add(float64(len(r.Body.Data)))
	return api.LogChunk200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) LogChunks(ctx context.Context, r api.LogChunksRequestObject) (api.LogChunksResponseObject, error) {
	ack, err := h.svc.LogChunks(ctx, caller(ctx), r.Body.Chunks)
	if err != nil {
		retryAfter(ctx, err)
		return api.LogChunksdefaultJSONResponse(h.errResp(err)), nil
	}
	h.metrics.chunks.Add(float64(len(r.Body.Chunks)))
	for _, c := range r.Body.Chunks {
		h.metrics.logBytes.Add(float64(len(c.Data)))
	}
	return api.LogChunks200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) Finalize(ctx context.Context, r api.FinalizeRequestObject) (api.FinalizeResponseObject, error) {
	ack, err := h.svc.Finalize(ctx, caller(ctx), r.Body)
	h.event("finalize", err)
	if err != nil {
		return api.FinalizedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Finalize200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) GateCheck(ctx context.Context, r api.GateCheckRequestObject) (api.GateCheckResponseObject, error) {
	lease, err := h.svc.GateCheck(ctx, caller(ctx), r.Body)
	h.metrics.gates.WithLabelValues(codeNames[codeOf(err)]).Inc()
	if err != nil {
		return api.GateCheckdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.GateCheck200JSONResponse(lease), nil
}

func (h *handlers) GateRevoke(ctx context.Context, r api.GateRevokeRequestObject) (api.GateRevokeResponseObject, error) {
	ack, err := h.svc.GateRevoke(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.GateRevokedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.GateRevoke200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

// page is a list request's filter and page size: the default size when the request names none
// (a limit it names, 0 included, the service checks).
func page(repo, env string, pr int, limit *int) service.Page {
	p := service.Page{Repo: repo, Environment: env, PR: pr, Limit: service.DefaultPageLimit}
	if limit != nil {
		p.Limit = *limit
	}
	return p
}

func (h *handlers) GatesList(ctx context.Context, r api.GatesListRequestObject) (api.GatesListResponseObject, error) {
	out, err := h.svc.Gates(ctx, caller(ctx), page(r.Params.Repo, r.Params.Environment, r.Params.Pr, r.Params.Limit), r.Params.Before)
	if err != nil {
		return api.GatesListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.GatesList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) GrantsList(ctx context.Context, r api.GrantsListRequestObject) (api.GrantsListResponseObject, error) {
	out, err := h.svc.Grants(ctx, caller(ctx), page(r.Params.Repo, r.Params.Environment, r.Params.Pr, r.Params.Limit), r.Params.Before)
	if err != nil {
		return api.GrantsListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.GrantsList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) ClaimsList(ctx context.Context, r api.ClaimsListRequestObject) (api.ClaimsListResponseObject, error) {
	out, err := h.svc.Claims(ctx, caller(ctx), r.Params.Repo, r.Params.Environment)
	if err != nil {
		return api.ClaimsListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ClaimsList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) ClaimsRelease(ctx context.Context, r api.ClaimsReleaseRequestObject) (api.ClaimsReleaseResponseObject, error) {
	ack, err := h.svc.ReleaseClaims(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.ClaimsReleasedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ClaimsRelease200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) ChecksList(ctx context.Context, r api.ChecksListRequestObject) (api.ChecksListResponseObject, error) {
	out, err := h.svc.Checks(ctx, caller(ctx), page(r.Params.Repo, r.Params.Environment, r.Params.Pr, r.Params.Limit), r.Params.Before)
	if err != nil {
		return api.ChecksListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ChecksList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) AdminChecksOverride(ctx context.Context, r api.AdminChecksOverrideRequestObject) (api.AdminChecksOverrideResponseObject, error) {
	ack, err := h.svc.OverrideCheck(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.AdminChecksOverridedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.AdminChecksOverride200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) AdminExecutionsCancel(ctx context.Context, r api.AdminExecutionsCancelRequestObject) (api.AdminExecutionsCancelResponseObject, error) {
	ack, err := h.svc.CancelExecution(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.AdminExecutionsCanceldefaultJSONResponse(h.errResp(err)), nil
	}
	return api.AdminExecutionsCancel200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) AdminGatesSatisfy(ctx context.Context, r api.AdminGatesSatisfyRequestObject) (api.AdminGatesSatisfyResponseObject, error) {
	ack, err := h.svc.SatisfyGate(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.AdminGatesSatisfydefaultJSONResponse(h.errResp(err)), nil
	}
	return api.AdminGatesSatisfy200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) AdminGrantsRelease(ctx context.Context, r api.AdminGrantsReleaseRequestObject) (api.AdminGrantsReleaseResponseObject, error) {
	ack, err := h.svc.ReleaseGrant(ctx, caller(ctx), r.Body)
	if err != nil {
		return api.AdminGrantsReleasedefaultJSONResponse(h.errResp(err)), nil
	}
	return api.AdminGrantsRelease200JSONResponse{AckJSONResponse: api.AckJSONResponse(ack)}, nil
}

func (h *handlers) ExecutionsList(ctx context.Context, r api.ExecutionsListRequestObject) (api.ExecutionsListResponseObject, error) {
	limit, err := service.Limit(r.Params.Limit, service.DefaultExecutionsLimit, service.MaxExecutionsLimit)
	var f store.ExecutionFilter
	if err == nil {
		f, err = service.ExecutionsAfter(store.ExecutionFilter{Repo: r.Params.Repo, Environment: r.Params.Environment, PR: r.Params.Pr, Limit: limit},
			r.Params.Before, r.Params.BeforeID)
	}
	var out []api.Execution
	if err == nil {
		out, err = h.svc.Executions(ctx, caller(ctx), f)
	}
	if err != nil {
		return api.ExecutionsListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ExecutionsList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) ExecutionGet(ctx context.Context, r api.ExecutionGetRequestObject) (api.ExecutionGetResponseObject, error) {
	out, err := h.svc.Execution(ctx, caller(ctx), r.Id)
	if err != nil {
		return api.ExecutionGetdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ExecutionGet200JSONResponse(*out), nil
}

func (h *handlers) LatestPlan(ctx context.Context, r api.LatestPlanRequestObject) (api.LatestPlanResponseObject, error) {
	out, err := h.svc.LatestPlan(ctx, caller(ctx), r.Params.Repo, r.Params.Environment, r.Params.Pr)
	if err != nil {
		return api.LatestPlandefaultJSONResponse(h.errResp(err)), nil
	}
	return api.LatestPlan200JSONResponse(*out), nil
}

func (h *handlers) ExecutionGates(ctx context.Context, r api.ExecutionGatesRequestObject) (api.ExecutionGatesResponseObject, error) {
	out, err := h.svc.ExecutionGates(ctx, caller(ctx), r.Id)
	if err != nil {
		return api.ExecutionGatesdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.ExecutionGates200JSONResponse(*out), nil
}

func (h *handlers) LogRead(ctx context.Context, r api.LogReadRequestObject) (api.LogReadResponseObject, error) {
	latest := !queryOf(ctx).Has("generation")
	limit, err := service.Limit(r.Params.Limit, service.DefaultLogReadMax, service.MaxLogReadLimit)
	var out *api.LogSlice
	if err == nil {
		out, err = h.svc.LogRead(ctx, caller(ctx), r.Id, r.Params.Stack, r.Params.Generation, latest, r.Params.Offset, limit)
	}
	if err != nil {
		return api.LogReaddefaultJSONResponse(h.errResp(err)), nil
	}
	return api.LogRead200JSONResponse(*out), nil
}

func (h *handlers) AuditList(ctx context.Context, r api.AuditListRequestObject) (api.AuditListResponseObject, error) {
	limit, err := service.Limit(r.Params.Limit, service.DefaultAuditLimit, service.MaxAuditLimit)
	var out []api.AuditEntry
	if err == nil {
		out, err = h.svc.Audit(ctx, caller(ctx), r.Params.Repo, limit, r.Params.Before)
	}
	if err != nil {
		return api.AuditListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.AuditList200JSONResponse(nonNil(out)), nil
}

func (h *handlers) Health(ctx context.Context, _ api.HealthRequestObject) (api.HealthResponseObject, error) {
	if err := h.ping(ctx); err != nil {
		return api.HealthdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.Health200JSONResponse{Status: "ok", Version: buildinfo.Version(), Store: h.svc.Store.Kind()}, nil
}

// directFunc serves an operation whose body the guard already decoded strictly.
type directFunc func(ctx context.Context, w http.ResponseWriter, body any) error

// direct returns, for the hot runner events, a path through the same strict-interface methods
// and generated response visitors that spares the generated code's second JSON decode.
func (h *handlers) direct() map[string]directFunc {
	return map[string]directFunc{
		"LogChunk": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.LogChunk(ctx, api.LogChunkRequestObject{Body: body.(*api.LogChunk)})
			if err != nil {
				return err
			}
			return resp.VisitLogChunkResponse(w)
		},
		"LogChunks": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.LogChunks(ctx, api.LogChunksRequestObject{Body: body.(*api.LogChunks)})
			if err != nil {
				return err
			}
			return resp.VisitLogChunksResponse(w)
		},
		"Phase": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.Phase(ctx, api.PhaseRequestObject{Body: body.(*api.PhaseEvent)})
			if err != nil {
				return err
			}
			return resp.VisitPhaseResponse(w)
		},
		"Phases": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.Phases(ctx, api.PhasesRequestObject{Body: body.(*api.PhaseEvents)})
			if err != nil {
				return err
			}
			return resp.VisitPhasesResponse(w)
		},
		"Update": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.Update(ctx, api.UpdateRequestObject{Body: body.(*api.Update)})
			if err != nil {
				return err
			}
			return resp.VisitUpdateResponse(w)
		},
		"Updates": func(ctx context.Context, w http.ResponseWriter, body any) error {
			resp, err := h.Updates(ctx, api.UpdatesRequestObject{Body: body.(*api.Updates)})
			if err != nil {
				return err
			}
			return resp.VisitUpdatesResponse(w)
		},
	}
}

// nonNil makes empty lists encode as [] rather than null.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func (h *handlers) DriftList(ctx context.Context, r api.DriftListRequestObject) (api.DriftListResponseObject, error) {
	out, err := h.svc.Drift(ctx, caller(ctx), r.Params.Repo, r.Params.Environment, r.Params.Stack, r.Params.Limit)
	if err != nil {
		return api.DriftListdefaultJSONResponse(h.errResp(err)), nil
	}
	return api.DriftList200JSONResponse(nonNil(out)), nil
}
