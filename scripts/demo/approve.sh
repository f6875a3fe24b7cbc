# shellcheck shell=bash
# Sourced by scripts/demo.sh: approves a plan's gates on its web page as an admin does in a
# browser, with curl: sign in with the admin's token through the sign-in form, read the plan's
# page, and send each of its Approve forms (the execution id and the content hashes the page
# shows, the session's anti-forgery token) with a reason. The server approves exactly the plan
# the page showed, or refuses (a newer plan arrived, other content).
#
# demo_approve_on_page PAGE TOKEN REASON COOKIES: PAGE is the plan's page URL, COOKIES a file
# for the session's cookies. Prints each gate it approves; returns non-zero when the sign-in or
# an approval fails, or when the page offers no Approve form.

# demo_unescape undoes what html/template escapes in an attribute value.
demo_unescape() {
  sed -e 's/&#43;/+/g' -e 's/&#34;/"/g' -e "s/&#39;/'/g" -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&amp;/\&/g'
}

demo_approve_on_page() {
  local page=$1 token=$2 reason=$3 jar=$4 site path html csrf code n=0 form action fields
  site=$(printf '%s' "$page" | sed 's|^\(https*://[^/]*\).*|\1|')
  path=${page#"$site"}
  # An unauthenticated page answers with the sign-in form and its anti-forgery cookie.
  html=$(curl -sS -c "$jar" -b "$jar" "$page")
  csrf=$(printf '%s\n' "$html" | sed -n 's/.*name="csrf" value="\([^"]*\)".*/\1/p' | head -n 1)
  code=$(curl -sS -o /dev/null -w '%{http_code}' -c "$jar" -b "$jar" --data-urlencode "token=$token" \
    --data-urlencode "csrf=$csrf" --data-urlencode "next=$path" "$site/ui/login")
  if [ "$code" != 303 ]; then
    echo "demo: signing in to $site as the admin answered HTTP $code" >&2
    return 1
  fi
  html=$(curl -fsS -b "$jar" "$page") || return 1
  # One line per Approve form: its action, then its hidden fields as name=value.
  while IFS= read -r form; do
    [ -n "$form" ] || continue
    action=$(printf '%s' "$form" | sed -n 's/.*<form class="approve" method="post" action="\([^"]*\)".*/\1/p' | demo_unescape)
    fields=()
    while IFS= read -r kv; do
      fields+=(--data-urlencode "$kv")
    done < <(printf '%s' "$form" | grep -o '<input type="hidden" name="[^"]*" value="[^"]*">' |
      sed 's/<input type="hidden" name="\([^"]*\)" value="\([^"]*\)">/\1=\2/' | demo_unescape)
    code=$(curl -sS -o "$jar.answer" -w '%{http_code}' -b "$jar" "${fields[@]}" --data-urlencode "reason=$reason" "$site$action")
    if [ "$code" != 303 ]; then
      echo "demo: the Approve form of $page answered HTTP $code:" >&2
      sed -n 's/.*<p class="notice" role="alert" id="notice">\(.*\)<\/p>.*/  \1/p' "$jar.answer" >&2
      return 1
    fi
    n=$((n + 1))
    printf '%s\n' "$form" | sed -n 's/.*name="class" value="\([^"]*\)"><input type="hidden" name="target" value="\([^"]*\)".*/demo: approved on the page: gate \1 on \2/p' | demo_unescape
  done < <(printf '%s\n' "$html" | awk '/<form class="approve"/ { f = 1 } f { printf "%s", $0 } /<\/form>/ { if (f) print ""; f = 0 }')
  if [ "$n" = 0 ]; then
    echo "demo: $page offers no Approve form" >&2
    return 1
  fi
}
