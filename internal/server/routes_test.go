package server

import (
	"net/http"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/tfstackplan/tfstackplan/internal/api"
	"github.com/tfstackplan/tfstackplan/internal/server/auth"
)

// TestRoutesFollowIndependentRoleRules checks the role table against rules stated here rather
// than derived from the table itself: every /admin/ path is admin-only, every read is open to
// viewers, and every mutating event, gate and claim path needs at least a runner.
func TestRoutesFollowIndependentRoleRules(t *testing.T) {
	for key, role := range Routes() {
		method, path, _ := strings.Cut(key, " ")
		switch {
		case strings.HasPrefix(path, "/admin/"):
			if role != auth.RoleAdmin {
				t.Errorf("%s needs %q, want admin", key, role)
			}
		case key == "GET /notifications": // receivers' answers and the events of every repository
			if role != auth.RoleAdmin {
				t.Errorf("%s needs %q, want admin", key, role)
			}
		case path == "/health":
			if role != "" {
				t.Errorf("%s needs %q, want no authentication", key, role)
			}
		case method == http.MethodGet:
			if role != auth.RoleViewer {
				t.Errorf("%s needs %q, want viewer", key, role)
			}
		case strings.HasPrefix(path, "/events/") || strings.HasPrefix(path, "/gates/") || strings.HasPrefix(path, "/claims/"):
			if role != auth.RoleRunner && role != auth.RoleAdmin {
				t.Errorf("mutating %s needs %q, want runner or admin", key, role)
			}
		default:
			t.Errorf("%s (role %q) is covered by no rule of this test: add one", key, role)
		}
	}
}

// TestRoutesCoverTheContract checks the role table names every operation of the OpenAPI contract
// (method, path and operation id) and every method of the generated strict server interface.
func TestRoutesCoverTheContract(t *testing.T) {
	spec, err := openapi3.NewLoader().LoadFromFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	inSpec := map[string]bool{}
	for path, item := range spec.Paths.Map() {
		for method, op := range item.Operations() {
			key := strings.ToUpper(method) + " " + path
			inSpec[key] = true
			r, ok := routes[key]
			switch {
			case !ok:
				t.Errorf("contract operation %s (%s) has no route", key, op.OperationID)
			case r.op != op.OperationID:
				t.Errorf("route %s is %q, the contract calls it %q", key, r.op, op.OperationID)
			}
		}
	}
	for key := range routes {
		if !inSpec[key] {
			t.Errorf("route %s is not in the contract", key)
		}
	}
	ops := map[string]bool{}
	for _, r := range routes {
		ops[r.op] = true
	}
	iface := reflect.TypeFor[api.StrictServerInterface]()
	var missing []string
	for i := range iface.NumMethod() {
		if name := iface.Method(i).Name; !ops[name] {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 || iface.NumMethod() != len(routes) {
		t.Fatalf("strict server interface has %d operations, routes %d; without a route: %v", iface.NumMethod(), len(routes), missing)
	}
}
