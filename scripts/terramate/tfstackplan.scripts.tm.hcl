# tfstackplan script library: the `plan` and `apply` scripts `tfstackplan run plan|apply` runs
# through `terramate script run [--changed] plan|apply` (see README.md).
#
# Each command is one argv list; terramate echoes it on stderr as
# `/<stack> (script:S job:J.C)> <argv joined by spaces>`, so every shell snippet is one line.
# HCL templates: `$${` is a literal `${` (a shell expansion), `${let.x}` is interpolated by
# terramate. Every TFSTACKPLAN_* variable has a default, so a human can run
# `terramate script run plan` by hand without the driver.

script "plan" {
  description = "tfstackplan: init, plan and save the plan and its JSON in each stack"

  lets {
    tf = global.tfstackplan_tf
    # Where output goes: the per-stack log (started afresh, then appended to) and, through tee,
    # terramate's stdout. tee ignores INT and TERM: a cancel signals the whole process group,
    # and a tee that died would kill tofu with SIGPIPE in the middle of its graceful shutdown,
    # losing state and leaving the state lock held.
    new_log = "(trap '' INT TERM; exec tee -- \"$${TFSTACKPLAN_LOG_FILE:-tfstackplan.log}\")"
    log     = "(trap '' INT TERM; exec tee -a -- \"$${TFSTACKPLAN_LOG_FILE:-tfstackplan.log}\")"
    out     = "\"$${TFSTACKPLAN_PLAN_OUT:-tfstackplan.tfplan}\""
    json    = "\"$${TFSTACKPLAN_PLAN_JSON:-tfstackplan.plan.json}\""
    timeout = "\"$${TFSTACKPLAN_LOCK_TIMEOUT:-0s}\""
  }

  job {
    commands = [
      ["tfstackplan", "run", "tick", "--phase", "init"],
      # Drops the previous run's plan files (a failed plan must not leave a stale JSON behind)
      # and starts the log afresh (tee without -a truncates it).
      ["bash", "-c", "set -o pipefail; umask 077; rm -f -- ${let.out} ${let.json}; ${let.tf} init -input=false -no-color 2>&1 | ${let.new_log}"],
      # Best effort: the driver passes one lock ID to every stack, and force-unlock fails where the
      # state is not locked under that ID; a state still locked makes the next command fail.
      ["bash", "-c", "set -o pipefail; umask 077; if [ -n \"$${TFSTACKPLAN_FORCE_UNLOCK:-}\" ]; then ${let.tf} force-unlock -force -no-color \"$TFSTACKPLAN_FORCE_UNLOCK\" 2>&1 | ${let.log} || echo \"tfstackplan: lock $TFSTACKPLAN_FORCE_UNLOCK not released here (another stack's lock?); going on\" | ${let.log}; fi"],
      ["tfstackplan", "run", "tick", "--phase", "plan"],
      ["bash", "-c", "set -o pipefail; umask 077; ${let.tf} plan -input=false -no-color -lock-timeout=${let.timeout} -out=${let.out} 2>&1 | ${let.log}"],
      ["tfstackplan", "run", "tick", "--phase", "show"],
      # The JSON holds sensitive values: it never goes to the log or the terminal (only show's
      # errors do), and it appears under its name only once complete (temp file, then mv).
      ["bash", "-c", "set -o pipefail; umask 077; json=${let.json}; trap 'rm -f -- \"$json.tmp\"' EXIT; ${let.tf} show -json -no-color ${let.out} 2>&1 >\"$json.tmp\" | ${let.log} && mv -f -- \"$json.tmp\" \"$json\""],
      ["tfstackplan", "run", "tick", "--phase", "done", "--status", "succeeded"],
    ]
  }
}

script "apply" {
  description = "tfstackplan: apply the plan the plan script saved in each stack"

  lets {
    tf      = global.tfstackplan_tf
    new_log = "(trap '' INT TERM; exec tee -- \"$${TFSTACKPLAN_LOG_FILE:-tfstackplan.log}\")"
    log     = "(trap '' INT TERM; exec tee -a -- \"$${TFSTACKPLAN_LOG_FILE:-tfstackplan.log}\")"
    out     = "\"$${TFSTACKPLAN_PLAN_OUT:-tfstackplan.tfplan}\""
    timeout = "\"$${TFSTACKPLAN_LOCK_TIMEOUT:-0s}\""
  }

  job {
    commands = [
      # A saved plan applies only in an initialised working directory (providers, modules,
      # backend), which a fresh CI checkout does not have yet.
      ["tfstackplan", "run", "tick", "--phase", "init"],
      ["bash", "-c", "set -o pipefail; umask 077; ${let.tf} init -input=false -no-color 2>&1 | ${let.new_log}"],
      ["bash", "-c", "set -o pipefail; umask 077; if [ -n \"$${TFSTACKPLAN_FORCE_UNLOCK:-}\" ]; then ${let.tf} force-unlock -force -no-color \"$TFSTACKPLAN_FORCE_UNLOCK\" 2>&1 | ${let.log} || echo \"tfstackplan: lock $TFSTACKPLAN_FORCE_UNLOCK not released here (another stack's lock?); going on\" | ${let.log}; fi"],
      ["tfstackplan", "run", "tick", "--phase", "apply"],
      # Applies exactly the saved plan: no new plan, no prompt; a missing or stale plan fails.
      ["bash", "-c", "set -o pipefail; umask 077; ${let.tf} apply -input=false -no-color -lock-timeout=${let.timeout} ${let.out} 2>&1 | ${let.log}"],
      ["tfstackplan", "run", "tick", "--phase", "done", "--status", "succeeded"],
    ]
  }
}
