package iamfake_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/tfstackplan/tfstackplan/internal/server/granter/iamfake"
)

const account = "sa@p.iam.gserviceaccount.com"

// call posts body to one IAM method and returns the status and the decoded answer.
func call(t *testing.T, f *iamfake.Server, method, query, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", f.URL+"v1/projects/-/serviceAccounts/"+account+":"+method+"?alt=json"+query, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+iamfake.Token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: %v in %s", method, err, data)
	}
	return res.StatusCode, out
}

func TestFakeFollowsIAMRules(t *testing.T) {
	f := iamfake.Start(t)
	cond := `{"role":"r/x","members":["user:a@b"],"condition":{"title":"t","expression":"true"}}`
	f.SetPolicy(account, iamfake.Policy{})
	_, p := call(t, f, "getIamPolicy", "", "")
	etag := p["etag"].(string)

	for _, tc := range []struct {
		name, body string
		code       int
	}{
		{"no etag", `{"policy":{"version":3,"bindings":[` + cond + `]}}`, 400},
		{"stale etag", `{"policy":{"etag":"c3RhbGU=","version":3}}`, 409},
		{"conditions need version 3", `{"policy":{"etag":"` + etag + `","version":1,"bindings":[` + cond + `]}}`, 400},
		{"member without type", `{"policy":{"etag":"` + etag + `","bindings":[{"role":"r/x","members":["a@b"]}]}}`, 400},
	} {
		if code, out := call(t, f, "setIamPolicy", "", tc.body); code != tc.code {
			t.Errorf("%s: HTTP %d %v, want %d", tc.name, code, out, tc.code)
		}
	}

	code, out := call(t, f, "setIamPolicy", "", `{"policy":{"etag":"`+etag+`","version":3,"bindings":[`+cond+`,`+strings.Replace(cond, "user:a@b", "user:c@d", 1)+`]}}`)
	if code != 200 || out["etag"] == etag || out["version"] != 3.0 {
		t.Fatalf("set: HTTP %d %v", code, out)
	}
	if got := f.Policy(account).Bindings; len(got) != 1 || len(got[0].Members) != 2 {
		t.Errorf("bindings with one role and condition were not merged: %+v", got)
	}
	if code, _ := call(t, f, "getIamPolicy", "", ""); code != 400 {
		t.Errorf("reading a conditional policy without version 3: HTTP %d, want 400", code)
	}
	if code, _ := call(t, f, "getIamPolicy", "&options.requestedPolicyVersion=3", ""); code != 200 {
		t.Errorf("reading with version 3: HTTP %d", code)
	}
	if code, _ := call(t, f, "getIamPolicy", "", `{"options":{"requestedPolicyVersion":3}}`); code != 400 {
		t.Errorf("getIamPolicy with a request body: HTTP %d, want 400 (IAM wants it empty)", code)
	}

	f.Fail("setIamPolicy", 1, 429)
	if code, _ := call(t, f, "getIamPolicy", "&options.requestedPolicyVersion=3", ""); code != 200 {
		t.Errorf("a setIamPolicy fault hit getIamPolicy: HTTP %d", code)
	}
	if code, out := call(t, f, "setIamPolicy", "", `{}`); code != 429 || out["error"].(map[string]any)["status"] != "RESOURCE_EXHAUSTED" {
		t.Errorf("scripted fault: HTTP %d %v", code, out)
	}
	if n := f.Calls("setIamPolicy"); n != 6 {
		t.Errorf("%d setIamPolicy calls counted, want 6", n)
	}
}

func TestFakeRequiresTheToken(t *testing.T) {
	f := iamfake.Start(t)
	f.AddAccount(account)
	res, err := http.Post(f.URL+"v1/projects/-/serviceAccounts/"+account+":getIamPolicy?alt=json", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Errorf("no token: HTTP %d, want 401", res.StatusCode)
	}
}

func TestFakeScriptsAnswers(t *testing.T) {
	f := iamfake.Start(t)
	f.AddAccount(account)
	f.Answer("getIamPolicy", 1, 200, "text/html", "<html>garbled</html>")
	req, err := http.NewRequest("POST", f.URL+"v1/projects/-/serviceAccounts/"+account+":getIamPolicy?alt=json", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+iamfake.Token)
	req.Header.Set("X-Goog-User-Project", "billed")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/html" || string(data) != "<html>garbled</html>" {
		t.Errorf("scripted answer: HTTP %d %q %q", res.StatusCode, res.Header.Get("Content-Type"), data)
	}
	if got := f.Header("X-Goog-User-Project"); got != "billed" {
		t.Errorf("recorded header %q, want the request's", got)
	}
	if code, out := call(t, f, "getIamPolicy", "", ""); code != 200 || out["etag"] == nil {
		t.Errorf("after the one scripted answer: HTTP %d %v, want the policy", code, out)
	}
}
