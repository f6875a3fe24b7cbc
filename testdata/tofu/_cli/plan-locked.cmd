tofu plan -input=false -no-color -lock-timeout=1s -out=tfstackplan.tfplan
