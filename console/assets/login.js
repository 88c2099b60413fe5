// Carries ?next= into the form so that sign-in returns to the page asked for.
const next = new URLSearchParams(location.search).get('next');
if (next) document.getElementById('next').value = next;
