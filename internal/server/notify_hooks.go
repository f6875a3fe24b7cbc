package server

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/service"
	"github.com/tfstackplan/tfstackplan/internal/server/store"
)

// Registerer is the registry /metrics serves, for the metrics of what runs beside the server
// (the notification worker).
func (s *Server) Registerer() prometheus.Registerer { return s.registry }

// NotificationsList lists notification deliveries (admins only: the route and the service
// both say so).
func (h *handlers) NotificationsList(ctx context.Context, r api.NotificationsListRequestObject) (api.NotificationsListResponseObject, error) {
	limit, err := service.Limit(r.Params.Limit, 50, service.MaxNotificationsLimit)
	var ds []store.Delivery
	if err == nil {
		ds, err = h.svc.Notifications(ctx, caller(ctx), store.DeliveryFilter{Status: string(r.Params.Status), Before: r.Params.Before, Limit: limit})
	}
	if err != nil {
		return api.NotificationsListdefaultJSONResponse(h.errResp(err)), nil
	}
	out := make([]api.Notification, 0, len(ds))
	for _, d := range ds {
		out = append(out, api.Notification{ID: d.ID, Delivery: d.Delivery, Target: d.Target, Event: d.Event, Repo: d.Repo,
			Environment: d.Environment, PR: d.PR, ExecutionID: d.ExecutionID, Status: api.NotificationStatus(d.Status),
			Attempts: d.Attempts, LastStatus: d.LastStatus, LastError: d.LastError, CreatedAt: d.CreatedAt, NextAt: d.NextAt,
			LastAt: d.LastAt, DeliveredAt: d.DeliveredAt})
	}
	return api.NotificationsList200JSONResponse(out), nil
}
