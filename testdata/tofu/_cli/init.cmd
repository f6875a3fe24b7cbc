tofu init -input=false -no-color
