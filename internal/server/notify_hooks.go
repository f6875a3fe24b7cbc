package server

import "github.com/prometheus/client_golang/prometheus"

// Registerer is the registry /metrics serves, for the metrics of what runs beside the server
// (the notification worker).
func (s *Server) Registerer() prometheus.Registerer { return s.registry }
