"""`kiln diagnose`: why is the first token slow? From a live server's Prometheus metrics, a saved snapshot of them,
or a `kiln bench` report, fill the symptom -> likely cause -> next step table with the figures behind each line,
and write the recipe changes it recommends as a recipe overlay that `extends` the current recipe."""
