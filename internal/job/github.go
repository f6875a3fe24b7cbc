package job

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// GitHub holds what a run reads from the GitHub Actions environment. Outside Actions every
// field is empty and Actions is false.
type GitHub struct {
	Actions     bool   // GITHUB_ACTIONS=true
	Repo        string // owner/name (GITHUB_REPOSITORY)
	SHA         string // the pull request's head commit, else GITHUB_SHA
	PR          int    // the pull request number (event file, else refs/pull/N/...)
	Actor       string // GITHUB_ACTOR
	RunURL      string // the workflow run's page
	StepSummary string // GITHUB_STEP_SUMMARY
	Output      string // GITHUB_OUTPUT
	RunnerTemp  string // RUNNER_TEMP
}

// githubEvent is the part of the event payload a run reads.
type githubEvent struct {
	Number      int `json:"number"`
	PullRequest *struct {
		Number int `json:"number"`
		Head   struct {
			SHA string `json:"sha"`
		} `json:"head"`
	} `json:"pull_request"`
}

// maxEventBytes bounds how much of the event file is read.
const maxEventBytes = 8 << 20

// GitHubFromEnv reads the GitHub Actions environment through getenv. A missing or unreadable
// event file is not an error: the fields it would give stay empty (flags can supply them).
func GitHubFromEnv(getenv func(string) string) GitHub {
	g := GitHub{
		Actions:     getenv("GITHUB_ACTIONS") == "true",
		Repo:        getenv("GITHUB_REPOSITORY"),
		SHA:         getenv("GITHUB_SHA"),
		Actor:       getenv("GITHUB_ACTOR"),
		StepSummary: getenv("GITHUB_STEP_SUMMARY"),
		Output:      getenv("GITHUB_OUTPUT"),
		RunnerTemp:  getenv("RUNNER_TEMP"),
	}
	if server, id := getenv("GITHUB_SERVER_URL"), getenv("GITHUB_RUN_ID"); server != "" && g.Repo != "" && id != "" {
		g.RunURL = strings.TrimSuffix(server, "/") + "/" + g.Repo + "/actions/runs/" + id
		if a := getenv("GITHUB_RUN_ATTEMPT"); a != "" && a != "1" {
			g.RunURL += "/attempts/" + a
		}
	}
	if ref := getenv("GITHUB_REF"); strings.HasPrefix(ref, "refs/pull/") {
		num, _, _ := strings.Cut(strings.TrimPrefix(ref, "refs/pull/"), "/")
		if n, err := strconv.Atoi(num); err == nil && n > 0 {
			g.PR = n
		}
	}
	if p := getenv("GITHUB_EVENT_PATH"); p != "" {
		if f, err := os.Open(p); err == nil {
			var ev githubEvent
			if json.NewDecoder(io.LimitReader(f, maxEventBytes)).Decode(&ev) == nil && ev.PullRequest != nil {
				if ev.PullRequest.Number > 0 {
					g.PR = ev.PullRequest.Number
				}
				// On pull_request events GITHUB_SHA is the merge commit; the plan is the head's.
				if ev.PullRequest.Head.SHA != "" {
					g.SHA = ev.PullRequest.Head.SHA
				}
			}
			f.Close()
		}
	}
	return g
}

// escapeData escapes a workflow command's message.
func escapeData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// escapeProperty escapes a workflow command's property value.
func escapeProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// annotateError writes an ::error:: workflow command.
func annotateError(w io.Writer, title, msg string) {
	annotate(w, "error", title, msg)
}

// annotate writes a workflow command of kind (error, warning) that annotates the run; the
// title and message are escaped, so that no text in them (a server's answer, a script's
// output) becomes a command of its own.
func annotate(w io.Writer, kind, title, msg string) {
	fmt.Fprintf(w, "::%s title=%s::%s\n", kind, escapeProperty(title), escapeData(msg))
}

// maxWarningAnnotations bounds the ::warning:: commands of a run (GitHub shows ten per step).
const maxWarningAnnotations = 10

// writeOutputs appends name=value pairs to the $GITHUB_OUTPUT file, each in the delimited
// multi-line form so no value can inject another output.
func writeOutputs(path string, kv [][2]string) error {
	var b strings.Builder
	for _, p := range kv {
		delim := randomDelimiter()
		for strings.Contains(p[1], delim) {
			delim = randomDelimiter()
		}
		fmt.Fprintf(&b, "%s<<%s\n%s\n%s\n", p[0], delim, p[1], delim)
	}
	return appendFile(path, b.String())
}

func randomDelimiter() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "tfstackplan_" + hex.EncodeToString(b[:])
}

// appendFile appends data to path (the step summary, the outputs file).
func appendFile(path, data string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, werr := io.WriteString(f, data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	return werr
}
