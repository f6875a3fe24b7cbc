// Package api holds the client, models and strict server interface generated from
// api/openapi.yaml. Do not edit api.gen.go: change the OpenAPI file and run `make generate`.
package api

//go:generate go tool oapi-codegen -config ../../api/oapi-codegen.yaml -o api.gen.go ../../api/openapi.yaml
